# dK of the stored scores at heads of 193-256 (the patches here: the dK/dV kernel makes dV alone on 32 x 16 tiles, a
# kernel of one product a tile pair makes dK of the stored dS^T) timed against the tree side by side
# (scripts/ab_trees.sh: before = main, after = main + these patches), then its GPU tests, then on the after tree the
# same split at d 112-192 (the rule keeps dK with dV there; `--dk-apart` times both) and the dV kernel's plans. One
# device call, about 9 min on an H100 (OUT and FUSELAB_REVISION from the call; device timeout 595):
#   bash pending/wide-heads-dk-from-scores/time_it.sh
# The shapes: session 50's stored-scores A/B (docs/ops/attention.md), d 208-256, causal and not, GQA, Nq != Nk, the
# last of the first command past the scores' budget (recomputed: a control whose time should not move).
# Keep it if forward + backward gains at the stored shapes and the control does not move; then `git am` it and gate.
export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
T0=$(date +%s)
S="--impl triton,sdpa-cudnn --dtype bf16 --backward --rep-ms 30 --warmup-ms 10 --rounds 2 --call-cost-ms 0"
OUT=$OUT FUSELAB_REVISION=${FUSELAB_REVISION:-unknown} BUILD=0 T_RUN=${T_RUN:-110} BEFORE="" \
  AFTER="pending/wide-heads-dk-from-scores/*.patch" \
  timeout ${T_AB:-440} bash scripts/ab_trees.sh attention --shape 3x12x4x777x777x256 --shape 6x8x2x513x1029x224 \
  --shape 5x8x8x1100x1100x208 --shape 1x16x4x3000x3000x256 $S --opt causal=true \
  --- attention --shape 2x8x8x1500x1500x224 --shape 9x16x4x257x257x240 --shape 4x16x16x900x900x256 $S 2>&1 \
  | grep -v Warn | tail -40
echo "ab done $(( $(date +%s) - T0 )) s"
for f in pending/wide-heads-dk-from-scores/*.patch; do patch -p1 -s < "$f" || exit 2; done
timeout $(( ${T_TESTS:-380} - ($(date +%s) - T0) )) python3 -m pytest -q -m gpu tests/ops/test_attention.py \
  -p no:cacheprovider -x -k "stored_scores or tma_kernels_match" 2>&1 | tail -4
echo "tests done $(( $(date +%s) - T0 )) s"
timeout $(( ${T_SPLIT:-500} - ($(date +%s) - T0) )) python3 scripts/attention_plan_sweep.py --dk-apart \
  --shape 8x12x12x1024x1024x128 --shape 2x16x16x1500x1500x192 --shape 3x8x8x2047x2047x160 \
  --shape 2x8x8x2000x2000x112 --causal both --rep-ms 100 --out "$OUT/dk_apart.jsonl" 2>&1 | grep -v -i warn | grep causal
timeout $(( ${T_ALL:-575} - ($(date +%s) - T0) )) python3 scripts/attention_plan_sweep.py --kernel dkdv \
  --plans 32x32x4x2,64x32x8x2,16x32x4x2 --shape 2x8x8x1500x1500x224 --shape 3x12x4x777x777x256 --causal both \
  --rep-ms 100 --out "$OUT/dv_plans.jsonl" 2>&1 | grep -v -i warn | grep causal
echo "all done $(( $(date +%s) - T0 )) s"
