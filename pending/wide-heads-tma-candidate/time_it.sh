# The wide-heads TMA candidate timed against the tree side by side (scripts/ab_trees.sh: before = the tree, after =
# the tree + this patch), then its GPU tests on the after tree. One device call, about 5 min on an H100:
#   bash pending/wide-heads-tma-candidate/time_it.sh   (OUT and FUSELAB_REVISION from the call)
export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
# the series the candidate is written on, where main does not have it yet
for f in pending/attention-stored-scores-and-one-chunk/*.patch; do [ -f "$f" ] && { patch -p1 -s < "$f" || exit 2; }; done
S="--impl triton,sdpa-cudnn --dtype bf16 --backward --rep-ms 30 --warmup-ms 10 --rounds 2 --call-cost-ms 0"
OUT=$OUT FUSELAB_REVISION=${FUSELAB_REVISION:-unknown} BUILD=0 T_RUN=${T_RUN:-80} AFTER="pending/wide-heads-tma-candidate/*.patch" \
  timeout ${T_AB:-230} bash scripts/ab_trees.sh attention --shape 24x16x4x117x117x256 --shape 3x12x4x777x777x256 \
  --shape 1x16x4x3000x3000x256 --shape 40x4x4x200x200x200 --shape 6x8x2x513x1029x224 $S --opt causal=true \
  --- attention --shape 2x8x8x1500x1500x224 --shape 8x16x16x300x300x256 $S 2>&1 | grep -v Warn | tail -40
echo "ab done $(( $(date +%s) - T0 )) s"
patch -p1 -s < pending/wide-heads-tma-candidate/0001-*.patch && timeout $(( 320 - ($(date +%s) - T0) )) \
  python3 -m pytest -q -m gpu tests/ops/test_attention.py -p no:cacheprovider -x \
  -k "wide_heads or tma_kernels_match or head_dims_and_dtypes and (256 or 192)" 2>&1 | tail -4
echo "all done $(( $(date +%s) - T0 )) s"
