#!/usr/bin/env bash
# The H200's short forward keys (ran in session 63; its table is 0002 here, its sweeps are in
# benchmarks/results/h200/explorations): the held-out short shapes swept first (own plans = the table before, beside
# 64x64x4x2 and 64x32x4x2, SDPA-flash and cuDNN), then the short class's forward tuned with the 2-stage candidates, as
# on the H100 (session 59), the same shapes swept on the tuned table, and keep.py's choice; the table and logs to $OUT.
#   OUT=$OUT bash pending/h200-short-forward/tune_it.sh   (device: nvidia-h200, needs_h200; 168 s in session 63)
cd "$(dirname "$0")/../.."; OUT=${OUT:-/tmp/out}; export PYTHONPATH=src
nvidia-smi --query-gpu=name --format=csv,noheader
S=""; for s in 209x8x8x91x91x64 84x4x4x125x125x48 64x12x12x200x200x80 30x16x16x300x300x96 48x16x16x129x129x128 24x16x4x500x500x96 11x32x8x999x999x80 40x12x12x640x640x128 17x8x8x127x127x96; do S="$S --shape $s"; done
timeout ${T1:-110} python3 scripts/attention_plan_sweep.py --forward-only --kernel fwd --plans 64x64x4x2,64x32x4x2 $S --causal both --rep-ms 30 --out "$OUT/short_many_h200.jsonl" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
timeout ${T2:-180} python3 -m fuselab tune attention --part fwd --part short --dtype bf16 --shape 96 --shape 80 \
  --shape 128 --shape 64 > "$OUT/tune.log" 2>&1
echo "tune rc=$?"; grep -v Warning "$OUT/tune.log" | tail -20
cp src/fuselab/ops/attention/plans/nvidia-h200-sm90.json "$OUT/"
# the held-out shapes again, "own" now the tuned table's plans (the first sweep's own: the table before)
timeout ${T3:-100} python3 scripts/attention_plan_sweep.py --forward-only --kernel fwd --plans 64x64x4x2,64x32x4x2 $S \
  --causal both --rep-ms 30 --out "$OUT/short_many_h200_tuned.jsonl" > "$OUT/sweep_tuned.log" 2>&1
echo "sweep after the tune rc=$?"
python3 pending/h200-short-forward/keep.py "$OUT/short_many_h200.jsonl" "$OUT/short_many_h200_tuned.jsonl" \
  src/fuselab/ops/attention/plans/nvidia-h200-sm90.json "$OUT/nvidia-h200-sm90.kept.json" | tee "$OUT/keep.log"
python3 - "$OUT"/short_many_h200*.jsonl <<'PY'
import json, sys
for line in (line for f in sys.argv[1:] for line in open(f)):
    r = json.loads(line); ms = r["ms"]
    print("x".join(map(str, r["shape"])), "c" if r["causal"] else "f", r["own_plans"]["fwd"][5:], " ".join(f"{k}={v*1e3:.1f}" for k, v in ms.items()), list(r["errors"]))
PY
