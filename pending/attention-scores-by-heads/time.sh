#!/usr/bin/env bash
# attention-scores-by-heads timed, one device call (about 7-9 min on an H100, builds included): this tree's src without
# the series against it (`scripts/ab_trees.sh`, "before" again after: the machine's drift), forward + backward, bf16,
# beside cuDNN and SDPA-flash. Run on main (the patch is applied to the after side) or on a tree that holds the series
# (the land branch: revert.diff takes it off the before side). The shapes: past the scores' 256 MiB budget at heads of
# more than 128 columns of work, which the series slices, four it was not written on (d 144, 176 GQA 3, 240, 160 GQA 2
# just past the budget) and two of session 70's run (d 200; d 192 GQA 3, causal); the control past the budget at 128
# columns, which the revised rule leaves whole and must not move (d 112 GQA 4, 1.38x in session 70 when sliced).
# The GPU test runs in the gate (tests/ops/test_attention.py, "slice_of_heads").
#   REV=<literal hash> OUT=$OUT bash pending/attention-scores-by-heads/time.sh
set -uo pipefail
REV=${REV:?}
HERE=pending/attention-scores-by-heads
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if grep -q "def score_slices" src/fuselab/ops/attention/triton_kernels.py; then
  SIDES=(BEFORE="$HERE/revert.diff" AFTER=)
else
  SIDES=(BEFORE= AFTER="$HERE/0001-*.patch")
fi
NEW="--shape 2x8x8x3500x3500x144 --shape 1x24x8x3300x3300x176 --shape 2x6x6x4500x4500x240 --shape 4x4x2x2900x2900x160"
OLD="--shape 3x8x8x2600x2600x200 --shape 1x32x8x3000x3000x112"
COMMON="--dtype bf16 --impl triton,sdpa-cudnn,sdpa-flash --backward --rep-ms 25 --rounds 1"
env "${SIDES[@]}" OUT=$OUT FUSELAB_REVISION=$REV AGAIN=1 T_RUN=${T_RUN:-100} timeout ${T_AB:-540} \
  bash scripts/ab_trees.sh attention $NEW $OLD --opt causal=false $COMMON --- \
  attention $NEW $OLD --shape 2x12x4x2500x2500x192 --opt causal=true $COMMON 2>&1 | tail -70
