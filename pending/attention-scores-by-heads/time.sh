#!/usr/bin/env bash
# attention-scores-by-heads timed, one device call (about 4-5 min on an H100, builds included): main's src against the
# series (`scripts/ab_trees.sh`, main again after: the machine's drift), forward + backward, bf16, beside cuDNN and
# SDPA-flash. The shapes whose scores pass 256 MiB (the series slices them): session 69's sweep (d 160, 192 GQA, 256)
# and shapes it was not chosen on (d 128 and 112 GQA 4, d 200 at two batches); the controls within the budget or under
# 128 columns (d 136, 224; d 96), which must not move. Then the series' GPU test on the after tree.
#   REV=<literal hash> OUT=$OUT bash pending/attention-scores-by-heads/time.sh
set -uo pipefail
REV=${REV:?}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
PAST="--shape 2x10x10x3000x3000x160 --shape 2x12x4x2500x2500x192 --shape 1x16x16x4096x4096x256
      --shape 2x8x8x4096x4096x128 --shape 1x32x8x3000x3000x112 --shape 3x8x8x2600x2600x200"
CONTROL="--shape 4x8x8x2048x2048x136 --shape 3x8x8x1777x1777x224 --shape 2x16x16x4096x4096x96"
COMMON="--dtype bf16 --impl triton,sdpa-cudnn,sdpa-flash --backward --rep-ms 30 --rounds 1"
OUT=$OUT FUSELAB_REVISION=$REV AFTER="pending/attention-scores-by-heads/*.patch" AGAIN=1 T_RUN=${T_RUN:-110} \
  timeout ${T_AB:-420} bash scripts/ab_trees.sh attention $PAST $CONTROL --opt causal=false $COMMON --- \
  attention $PAST --opt causal=true $COMMON 2>&1 | tail -60
cd /tmp/ab-trees/after && PYTHONPATH=src FUSELAB_EXT_DIR=/tmp/ab-trees/ext-after timeout ${T_TEST:-90} python3 -m pytest \
  -q -m gpu tests/ops/test_attention.py -k "slice_of_heads" 2>&1 | tail -5
