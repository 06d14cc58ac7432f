#!/usr/bin/env bash
# attention-order-tail on a GPU, in one device call (about 2-3 min; on main, the series NOT applied): main against
# main + 0001 (scripts/ab_trees.sh; the order across heads' last group takes the heads left over, and groups are large
# enough that a group's work outlasts its longest block). bf16, causal, forward + backward, triton and cuDNN side by
# side, at shapes a list schedule says lose a last group (17x2x2x1914: 34 heads, 16 + 16 + 2; 3x8x8x2493,
# 15x4x4x1295, 21x8x8x423, 25x8x4x1717), the many-head shapes whose groups the rule enlarges (40x12x12x1100: 28 heads a
# group where 16 read what L2 holds; 20x4x4x1344; 50x4x4x700) and three in no draw.
#   OUT=$OUT FUSELAB_REVISION=<rev> timeout 280 bash pending/attention-order-tail/time_it.sh   (device timeout 290)
# Land 0001 if the changed shapes gain and none loses past cuDNN's drift in the same run; then the gate.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
A=(17x2x2x1914x1914x128 15x4x4x1295x1295x80 3x8x8x2493x2493x80 21x8x8x423x423x80 25x8x4x1717x1717x96
   40x12x12x1100x1100x64 20x4x4x1344x1344x128 9x12x4x2222x2222x96 50x4x4x700x700x128 6x6x6x3333x3333x80)
SH=$(printf -- "--shape %s " "${A[@]}")
O="--opt causal=true --dtype bf16 --backward --impl triton,sdpa-cudnn --rep-ms 30 --warmup-ms 15 --rounds 2
   --call-cost-ms 0"
# shellcheck disable=SC2086
OUT="$OUT/ab" BUILD=0 BEFORE="" AFTER="pending/attention-order-tail/0001-*.patch" T_RUN=${T_RUN:-120} \
  bash scripts/ab_trees.sh attention $SH $O
