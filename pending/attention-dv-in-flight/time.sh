#!/usr/bin/env bash
# attention-dv-in-flight timed: `scripts/ab_trees.sh` of this tree against it with the patch, the triton impl, this
# tree again after (the drift). bf16, forward + backward (the patch moves the backward's dK/dV kernels only). Shapes:
# the leaderboard's (its dK/dV kernel the gap to cuDNN, docs/ops/attention.md, session 66), the GPT block's, and one
# of each head width whose dK/dV kernel compiles with other spills (sm_90: d 64 28 -> 132 bytes, d 80 224 -> 124, d 96
# 288 -> 548, d 128 0 -> 44, d 256 364 -> 376), both masks; none was chosen for it. About 4-5 min on an H100 with the
# builds. On main, or on main with pending/attention-slices-unmasked (the patch applies on both):
#   REV=<literal hash> OUT=$OUT bash pending/attention-dv-in-flight/time.sh
set -uo pipefail
REV=${REV:?}
CAUSAL="--shape 16x1x1x16384x16384x64 --shape 8x12x12x1024x1024x64 --shape 4x16x16x2048x2048x80
  --shape 30x8x8x200x200x80 --shape 1x16x4x4000x4000x128 --shape 3x12x4x5000x5000x32 --shape 2x8x8x2000x2000x256"
UNMASKED="--shape 2x8x8x3000x3000x96 --shape 2x8x8x3000x3000x128 --shape 3x16x4x2222x2222x64
  --shape 2x8x8x2000x2000x200 --shape 8x16x16x1000x1000x80"
COMMON="--impl triton --dtype bf16 --backward --rep-ms 25 --rounds 1"
AFTER="$(ls pending/attention-dv-in-flight/0001-*.patch)" OUT=$OUT FUSELAB_REVISION=$REV AGAIN=1 T_RUN=${T_RUN:-80} \
  timeout ${T_AB:-330} bash scripts/ab_trees.sh attention $CAUSAL --opt causal=true $COMMON --- \
  attention $UNMASKED --opt causal=false $COMMON 2>&1 | tail -40
