#!/usr/bin/env bash
# attention-scores-by-heads and attention-aligned-rows timed together in one device call (about 7 min on an H100,
# builds included), on a tree that holds both (the land branch, pending/README.md): `scripts/ab_trees.sh` of the tree
# with both taken off (their revert.diff files, the later first) against the tree, the triton impl alone, "before"
# again after (the machine's drift); then cuDNN and SDPA-flash once on the tree, beside. Each shape moves by one series
# only, but for 3x8x8x2600x2600x200 (past the budget at d 200: both):
# - scores by heads (heads past 128 columns of work whose scores pass 256 MiB): d 144, 176 GQA 3, 240, 160 GQA 2 (not
#   written on), d 192 GQA 3 causal; its control d 112 past the budget (left whole by the revised rule);
# - aligned rows (rows of no multiple of 16 columns): d 200 stored, d 34, 40 both masks, 72, 100, 120, 136;
# - controls of both: d 64 and 96.
#   REV=<literal hash> OUT=$OUT bash pending/time-attention-series.sh
set -uo pipefail
REV=${REV:?}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
grep -q "def row_align" src/fuselab/ops/attention/triton_kernels.py \
  && grep -q "def score_slices" src/fuselab/ops/attention/triton_kernels.py \
  || { echo "this tree does not hold both series (apply them: pending/README.md)"; exit 2; }
REVERT="pending/attention-aligned-rows/revert.diff pending/attention-scores-by-heads/revert.diff"
UNMASKED="--shape 2x8x8x3500x3500x144 --shape 1x24x8x3300x3300x176 --shape 2x6x6x4500x4500x240
  --shape 4x4x2x2900x2900x160 --shape 1x32x8x3000x3000x112 --shape 3x8x8x2600x2600x200 --shape 2x8x8x1500x1500x200
  --shape 1x12x12x9000x9000x34 --shape 8x12x12x1024x1024x40 --shape 2x8x8x2000x2000x100 --shape 4x8x8x2048x2048x136
  --shape 2x16x16x4096x4096x96"
CAUSAL="--shape 2x12x4x2500x2500x192 --shape 1x24x8x3300x3300x176 --shape 3x8x8x2600x2600x200
  --shape 6x16x4x2500x2500x40 --shape 4x16x16x2048x2048x72 --shape 2x16x4x3000x3000x120 --shape 8x12x12x1024x1024x64"
COMMON="--dtype bf16 --backward --rep-ms 25 --rounds 1"
BEFORE="$REVERT" OUT=$OUT FUSELAB_REVISION=$REV AGAIN=1 T_RUN=${T_RUN:-110} timeout ${T_AB:-420} \
  bash scripts/ab_trees.sh attention $UNMASKED --opt causal=false --impl triton $COMMON --- \
  attention $CAUSAL --opt causal=true --impl triton $COMMON 2>&1 | tail -60
export PYTHONPATH=src FUSELAB_EXT_DIR=/tmp/ab-trees/ext-after
timeout ${T_PEERS:-120} python3 -m fuselab bench attention $UNMASKED --opt causal=false --impl sdpa-cudnn,sdpa-flash \
  $COMMON --out "$OUT/peers_unmasked.json" > "$OUT/peers_unmasked.log" 2>&1; echo "peers unmasked rc=$?"
timeout ${T_PEERS:-120} python3 -m fuselab bench attention $CAUSAL --opt causal=true --impl sdpa-cudnn,sdpa-flash \
  $COMMON --out "$OUT/peers_causal.json" > "$OUT/peers_causal.log" 2>&1; echo "peers causal rc=$?"
