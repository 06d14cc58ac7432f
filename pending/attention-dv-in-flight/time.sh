#!/usr/bin/env bash
# attention-dv-in-flight (dP^T's product before dV's where the head is one chunk; two chunks keep main's order) timed:
# `scripts/ab_trees.sh` of this tree against it with the patch, the triton impl, this tree again after (the drift).
# bf16, forward + backward (the patch moves the backward's dK/dV kernels only). Shapes: the leaderboard's, heads of one
# chunk that session 73 timed (d 32, 48 GQA 4, 64, 128) and ones it did not (d 40, 56, 120, 200 causal), and heads of
# two chunks, whose kernels the patch compiles as main (d 80, 96 as in session 73; d 160, 176 not timed). About 5-7 min
# on an H100 with the builds. On main:
#   REV=<literal hash> OUT=$OUT bash pending/attention-dv-in-flight/time.sh
set -uo pipefail
REV=${REV:?}
CAUSAL="--shape 16x1x1x16384x16384x64 --shape 3x12x4x5000x5000x32 --shape 6x16x4x2500x2500x40
  --shape 2x12x12x3300x3300x56 --shape 2x16x4x3000x3000x120 --shape 3x8x8x2600x2600x200 --shape 2x8x8x4500x4500x72
  --shape 2x10x5x3000x3000x160"
UNMASKED="--shape 2x8x2x3700x3700x48 --shape 2x8x8x3000x3000x128 --shape 3x12x12x2100x2100x96
  --shape 8x16x16x1000x1000x80 --shape 1x24x8x3300x3300x176"
COMMON="--impl triton --dtype bf16 --backward --rep-ms 25 --rounds 1"
AFTER="$(ls pending/attention-dv-in-flight/0001-*.patch)" OUT=$OUT FUSELAB_REVISION=$REV AGAIN=1 T_RUN=${T_RUN:-100} \
  timeout ${T_AB:-500} bash scripts/ab_trees.sh attention $CAUSAL --opt causal=true $COMMON --- \
  attention $UNMASKED --opt causal=false $COMMON 2>&1 | tail -40
