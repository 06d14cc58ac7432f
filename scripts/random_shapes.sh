#!/usr/bin/env bash
# The shape-robustness bench on a GPU, in one command (issue 16): random shapes drawn with a seed not tuned on, and
# the cliff shapes of the table. Writes under $OUT (default /tmp/random_shapes).
#   N=24 SEED=7 IMPLS=torch,triton scripts/random_shapes.sh
set -u
OUT=${OUT:-/tmp/random_shapes}; N=${N:-24}; SEED=${SEED:-7}; IMPLS=${IMPLS:-torch,triton}
mkdir -p "$OUT"
COMMON=(--impl "$IMPLS" --dtype fp32 --dtype bf16 --rep-ms "${REP_MS:-25}" --warmup-ms 10 --rounds 2 --call-cost-ms 0)
timeout "${T_SOFTMAX:-80}" python -m fuselab bench softmax "${COMMON[@]}" --shapes "random:$N" --seed "$SEED" \
  --out "$OUT/softmax_random.json" --plot "$OUT/softmax_random.png" > "$OUT/softmax_random.log" 2>&1
echo "softmax random rc=$?"
timeout "${T_GELU:-45}" python -m fuselab bench gelu "${COMMON[@]}" --opt approximate=tanh --shapes "random:$N" \
  --seed "$SEED" --out "$OUT/gelu_random.json" --plot "$OUT/gelu_random.png" > "$OUT/gelu_random.log" 2>&1
echo "gelu random rc=$?"
timeout "${T_CLIFFS:-40}" python -m fuselab bench softmax "${COMMON[@]}" --shape 2048x32769 --shape 1335x50257 \
  --shape 520236x129 --shape 65472x1025 --shape 64x1048573 --out "$OUT/cliffs.jsonl" > "$OUT/cliffs.log" 2>&1
timeout "${T_CLIFFS:-40}" python -m fuselab bench gelu "${COMMON[@]}" --opt approximate=tanh --shape 67108865 \
  --shape 45088771 --shape 100663313 --out "$OUT/cliffs.jsonl" >> "$OUT/cliffs.log" 2>&1
timeout 30 python -m fuselab bench gelu "${COMMON[@]}" --opt approximate=tanh --layout sliced --shape 8192x8192 \
  --out "$OUT/cliffs.jsonl" >> "$OUT/cliffs.log" 2>&1
echo "cliffs rc=$?"
