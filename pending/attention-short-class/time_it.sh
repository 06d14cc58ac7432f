#!/usr/bin/env bash
# attention-short-class on a GPU, in one device call (about 8-9 min; the tree with the series applied by `git am`):
# 1. `fuselab tune attention --part short` in bf16 at d 64, 80, 96 and 128, resuming session 53's journal on an H100
#    (6 of its 8 cases; another GPU tunes all 8, about 4.5 min), writing this GPU's table (an H100: its own, laid over
#    the H200's it reads) into the tree; the table and the journal to $OUT.
# 2. scripts/ab_trees.sh: that tree without the new table ("before": the long class's plans at every length) against
#    it ("after"), bf16, triton and cuDNN, forward + backward, at 10 shapes of 91-1029 tokens (none a tuning length),
#    causal and not, then the seed-11 draw (causal).
#   OUT=$OUT FUSELAB_REVISION=<rev> timeout 585 bash pending/attention-short-class/time_it.sh
# Land the table (copy $OUT/<key>.json into src/fuselab/ops/attention/plans/) if "after" gains at the short shapes and
# loses nowhere past the run's noise (cuDNN's own drift in the same runs); else land the series without a table.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
export PYTHONPATH=src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
PLANS=src/fuselab/ops/attention/plans
rm -rf /tmp/plans-before && cp -r "$PLANS" /tmp/plans-before
cp pending/attention-short-class/tune_short_h100.jsonl "$OUT/tune_short.jsonl"
timeout "${TUNE_S:-300}" python3 -m fuselab tune attention --part short --dtype bf16 --shape 64 --shape 80 --shape 96 \
  --shape 128 --journal "$OUT/tune_short.jsonl" > "$OUT/tune_short.log" 2>&1
echo "tune rc=$?"; tail -n 12 "$OUT/tune_short.log"
: > "$OUT/table.patch"
for f in "$PLANS"/*.json; do
  name=$(basename "$f")
  cmp -s "$f" "/tmp/plans-before/$name" && continue
  cp "$f" "$OUT/$name"
  { echo "diff --git a/$f b/$f"; diff -uN --label "a/$f" --label "b/$f" "/tmp/plans-before/$name" "$f"; } >> "$OUT/table.patch"
done
rm -rf "$PLANS" && cp -r /tmp/plans-before "$PLANS"  # the tree as it was: "before"
[ -s "$OUT/table.patch" ] || { echo "no table written: nothing to compare"; exit 1; }
A=(209x8x8x91x91x64 107x2x2x256x256x64 64x12x12x200x200x80 40x16x4x333x333x96 30x8x8x512x512x128
   20x12x12x700x700x64 48x16x16x129x129x128 11x32x8x999x999x80 15x16x4x1000x1000x64 6x8x2x513x1029x112)
SH=$(printf -- "--shape %s " "${A[@]}")
O="--dtype bf16 --backward --impl triton,sdpa-cudnn --rep-ms 40 --warmup-ms 20 --rounds 2 --call-cost-ms 0"
# shellcheck disable=SC2086
OUT="$OUT" BUILD=0 BEFORE="" AFTER="$OUT/table.patch" T_RUN=${T_RUN:-110} bash scripts/ab_trees.sh \
  attention $SH --opt causal=true $O --- attention $SH --opt causal=false $O \
  --- attention --shapes random:40 --seed 11 --opt causal=true $O
