#!/usr/bin/env bash
# attention-slices-unmasked timed on a tree that holds it (main + `git am` of its patch): `scripts/ab_trees.sh` of the
# tree with the mend taken off (revert.diff: causal shapes past the scores' budget sliced, as main) against the tree
# (causal whole), the triton impl, "before" again after (the drift). Causal, bf16, forward + backward: d 200 (pointer
# kernels; 0.43x with both series of session 71), d 192 GQA 3 and d 176 GQA 3 (1.36-1.37x sliced), and d 160 GQA 2
# (not written on). About 2-3 min on an H100 with the builds.
#   REV=<literal hash> OUT=$OUT bash pending/attention-slices-unmasked/time.sh
set -uo pipefail
REV=${REV:?}
grep -q "causal or d_work(d) <= 128" src/fuselab/ops/attention/triton_kernels.py \
  || { echo "this tree does not hold the mend (git am pending/attention-slices-unmasked/*.patch)"; exit 2; }
S="--shape 3x8x8x2600x2600x200 --shape 2x12x4x2500x2500x192 --shape 1x24x8x3300x3300x176 --shape 2x10x5x3000x3000x160"
BEFORE=pending/attention-slices-unmasked/revert.diff OUT=$OUT FUSELAB_REVISION=$REV AGAIN=1 T_RUN=${T_RUN:-45} \
  timeout ${T_AB:-150} bash scripts/ab_trees.sh attention $S --opt causal=true --impl triton --dtype bf16 --backward \
  --rep-ms 25 --rounds 1 2>&1 | tail -20
