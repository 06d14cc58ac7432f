# The stored scores at heads of 193-256 timed against the tree side by side (scripts/ab_trees.sh: before = main,
# after = main + this patch), then the GPU tests it touches on the after tree. One device
# call, about 8-9 min on an H100 (OUT and FUSELAB_REVISION from the call; device timeout 595):
#   bash pending/wide-heads-stored-scores-candidate/time_it.sh
# The shapes: d 200-256, causal and not, GQA, Nq != Nk, the scores within the 256 MiB budget (stored) but for the
# last of the first command (past it: recomputed, a control whose time should not move).
export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
S="--impl triton,sdpa-cudnn --dtype bf16 --backward --rep-ms 30 --warmup-ms 10 --rounds 2 --call-cost-ms 0"
# T_RUN: a run's first case compiles for about 30 s on a cold tree, then about 4 s a Triton case (session 49)
OUT=$OUT FUSELAB_REVISION=${FUSELAB_REVISION:-unknown} BUILD=0 T_RUN=${T_RUN:-110} BEFORE="" \
  AFTER="pending/wide-heads-stored-scores-candidate/*.patch" \
  timeout ${T_AB:-440} bash scripts/ab_trees.sh attention --shape 3x12x4x777x777x256 --shape 6x8x2x513x1029x224 \
  --shape 5x8x8x1100x1100x208 --shape 1x16x4x3000x3000x256 $S --opt causal=true \
  --- attention --shape 2x8x8x1500x1500x224 --shape 9x16x4x257x257x240 --shape 4x16x16x900x900x256 $S 2>&1 \
  | grep -v Warn | tail -40
echo "ab done $(( $(date +%s) - T0 )) s"
patch -p1 -s < pending/wide-heads-stored-scores-candidate/*.patch || exit 2
timeout $(( ${T_ALL:-575} - ($(date +%s) - T0) )) python3 -m pytest -q -m gpu tests/ops/test_attention.py \
  -p no:cacheprovider -x \
  -k "wide_heads or tma_kernels_match or stored_scores or head_dims_and_dtypes and (256 or 192)" \
  2>&1 | tail -4
echo "all done $(( $(date +%s) - T0 )) s"
