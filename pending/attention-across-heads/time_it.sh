#!/usr/bin/env bash
# attention-across-heads on a GPU, in one device call (about 7-8 min; on main, the series NOT applied):
# 1. scripts/ab_trees.sh: main against main + 0001 (causal blocks numbered across all heads, longest first);
# 2. main + 0001 against main + 0001 + 0002 (across groups of SMs / ORDER_SHARE heads: 16 on an H100 or H200).
# bf16, causal, forward + backward, triton and cuDNN side by side, at shapes of few to many heads: five the session-54
# probe did not time (none of the issue's regime), three of the regime it did not time, the leaderboard's, and two
# it did (1x8x8x5179 gained 0.83x, 20x4x4x1344 lost 1.08x forward with 80 heads across).
#   OUT=$OUT FUSELAB_REVISION=<rev> timeout 585 bash pending/attention-across-heads/time_it.sh   (device timeout 595)
# Land 0001 + 0002 if the groups keep the gains and lose nowhere past the noise (cuDNN's drift in the same runs), else
# 0001 alone if it does; then the gate, then scripts/attention_results.sh (the regime and seed-11 draws).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
P=pending/attention-across-heads
A=(2x12x12x3001x3001x128 1x24x8x6143x6143x96 5x6x6x2500x2500x80 1x32x32x4500x4500x64 40x12x12x1100x1100x64
   1x16x4x11589x11589x128 14x4x4x3798x3798x128 8x2x2x2477x2477x128 16x1x1x16384x16384x64
   1x8x8x5179x5179x128 20x4x4x1344x1344x128)
SH=$(printf -- "--shape %s " "${A[@]}")
O="--opt causal=true --dtype bf16 --backward --impl triton,sdpa-cudnn --rep-ms 40 --warmup-ms 20 --rounds 2
   --call-cost-ms 0"
# shellcheck disable=SC2086
OUT="$OUT/all" BUILD=0 BEFORE="" AFTER="$P/0001-*.patch" T_RUN=${T_RUN:-130} bash scripts/ab_trees.sh attention $SH $O
# shellcheck disable=SC2086
OUT="$OUT/groups" BUILD=0 BEFORE="$P/0001-*.patch" AFTER="$P/0001-*.patch $P/0002-*.patch" T_RUN=${T_RUN:-130} \
  bash scripts/ab_trees.sh attention $SH $O
