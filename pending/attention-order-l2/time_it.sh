#!/usr/bin/env bash
# attention-order-l2 on a GPU, in one device call (about 3 min; on main, the series NOT applied): main against
# main + 0001 (scripts/ab_trees.sh; the order across heads' groups grow to outlast their longest block only while
# their heads' reads fit a quarter of L2, and the heads are split evenly among the groups). bf16, causal, forward +
# backward, triton and cuDNN side by side, at the shapes whose groups change: 80 and 200 heads of d 128, which lost
# 2-4% to fa8c98f's larger groups (20x4x4x1344, 50x4x4x700), the regime's worst (14x4x4x3798), the tail rule's gains
# to keep (17x2x2x1914, 21x8x8x423, 15x4x4x1295, 6x6x6x3333, 10x8x8x1553), 480 heads, and two in no draw.
#   OUT=$OUT FUSELAB_REVISION=<rev> timeout 290 bash pending/attention-order-l2/time_it.sh   (device timeout 300)
# Land 0001 if the changed shapes gain and none loses past cuDNN's drift in the same run; then the gate.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
A=(20x4x4x1344x1344x128 50x4x4x700x700x128 14x4x4x3798x3798x128 17x2x2x1914x1914x128 21x8x8x423x423x80
   15x4x4x1295x1295x80 6x6x6x3333x3333x80 10x8x8x1553x1553x80 40x12x12x1100x1100x64 24x6x6x1777x1777x128
   30x8x8x1000x1000x128)
SH=$(printf -- "--shape %s " "${A[@]}")
O="--opt causal=true --dtype bf16 --backward --impl triton,sdpa-cudnn --rep-ms 30 --warmup-ms 15 --rounds 2
   --call-cost-ms 0"
# shellcheck disable=SC2086
OUT="$OUT/ab" BUILD=0 BEFORE="" AFTER="pending/attention-order-l2/0001-*.patch" T_RUN=${T_RUN:-130} \
  bash scripts/ab_trees.sh attention $SH $O
