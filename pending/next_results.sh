#!/usr/bin/env bash
# The next device session's third call (pending/README.md), on the gated tree: the
# results they are waiting for, each bounded and written under $OUT as it finishes.
#   1. the softmax seed-2036 draw (200 shapes a dtype, 6000 cases, about two calls' worth): afresh, or with
#      RESUME_FROM=<dir of this script's draw/*.jsonl from an earlier call at the same revision> going on from there;
#   2. benchmarks/compiled_guards.py (drop-in-flat: the guards a compiled call evaluates, on CUDA tensors);
#   3. benchmarks/mlp_calls.py (issue 26's compiled feed-forward block, against docs/call-cost.md's table).
# Liger-Kernel for the draw's rival: carry explore/liger (the unzipped wheel; pending/README's setup line).
#   OUT=$OUT FUSELAB_REVISION=<the gated commit> timeout 590 bash pending/next_results.sh   # run with carry explore/liger
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/next_results}; mkdir -p "$OUT"
export PYTHONPATH=src
resume=${RESUME_FROM:-}
liger=$([ -d explore/liger ] && echo "$PWD/explore/liger")
[ -n "$liger" ] || echo "no explore/liger: the draw runs without its Liger rival (carry explore/liger)"
OUT="$OUT/draw" RESUME_FROM=$resume OPS=softmax N=200 SEED=2036 WARM_JOBS=15 LIGER=$liger \
  T_SOFTMAX=${T_SOFTMAX:-270} bash scripts/random_shapes.sh
tail -5 "$OUT/draw/softmax_random.log"
tar czf "$OUT/draw.tgz" -C "$OUT" draw && rm -rf "$OUT/draw"  # one file back (the device returns at most 8)
timeout "${T_GUARDS:-100}" python3 benchmarks/compiled_guards.py --repeats 3 --out "$OUT/compiled_guards.json"
echo "compiled_guards rc=$?"
timeout "${T_MLP:-180}" python3 benchmarks/mlp_calls.py --modes eager,default,max-autotune-no-cudagraphs \
  --tokens 1,4099 --budget-ms 150 --out "$OUT/mlp_calls.json" > "$OUT/mlp_calls.log" 2>&1
echo "mlp_calls rc=$?"; tail -20 "$OUT/mlp_calls.log"
