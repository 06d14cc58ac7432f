#!/usr/bin/env bash
# attention-aligned-rows timed, one device call (about 7-9 min on an H100, builds included): this tree's src without the
# series against it (`scripts/ab_trees.sh`, "before" again after: the machine's drift), forward + backward, bf16, beside
# cuDNN and SDPA-flash. Run on a tree that holds the series (revert.diff takes it off the before side; on main, the
# patch is applied to the after side, over the series before it in pending/README.md's order). The shapes: heads whose
# rows are no multiple of 16 columns, where the pointer kernels and the delta sums now load 16 bytes (d 200 stored and
# past the budget, d 40 both masks, d 72, 120, 136) or 4-8 (d 34, 100); the controls, heads of 64 and 96, must not move.
#   REV=<literal hash> OUT=$OUT bash pending/attention-aligned-rows/time.sh
set -uo pipefail
REV=${REV:?}
HERE=pending/attention-aligned-rows
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if grep -q "def row_align" src/fuselab/ops/attention/triton_kernels.py; then
  SIDES=(BEFORE="$HERE/revert.diff" AFTER=)
else
  SIDES=(BEFORE= AFTER="$HERE/0001-*.patch")
fi
UNMASKED="--shape 3x8x8x2600x2600x200 --shape 2x8x8x1500x1500x200 --shape 1x12x12x9000x9000x34
  --shape 8x12x12x1024x1024x40 --shape 2x8x8x2000x2000x100 --shape 4x8x8x2048x2048x136 --shape 2x16x16x4096x4096x96"
CAUSAL="--shape 6x16x4x2500x2500x40 --shape 4x16x16x2048x2048x72 --shape 2x16x4x3000x3000x120
  --shape 2x8x8x1500x1500x200 --shape 8x12x12x1024x1024x64"
COMMON="--dtype bf16 --impl triton,sdpa-cudnn,sdpa-flash --backward --rep-ms 25 --rounds 1"
env "${SIDES[@]}" OUT=$OUT FUSELAB_REVISION=$REV AGAIN=1 T_RUN=${T_RUN:-100} timeout ${T_AB:-540} \
  bash scripts/ab_trees.sh attention $UNMASKED --opt causal=false $COMMON --- \
  attention $CAUSAL --opt causal=true $COMMON 2>&1 | tail -70
