#!/usr/bin/env bash
# Results the next device sessions wait for (pending/README.md), on the gated tree, each bounded and written under
# $OUT as it finishes. PART=calls (one call, about 8 min):
#   benchmarks/compiled_guards.py (drop-in-flat: the guards a compiled call evaluates, on CUDA tensors; 100 s was too
#   little on an H100, 2026-12-05) and benchmarks/mlp_calls.py (issue 26's compiled feed-forward block, against
#   docs/call-cost.md's table; 180 s reached 5 of its 6 mode x token sets).
# PART=draw (several calls): the softmax seed-2036 draw (200 shapes a dtype, 6000 cases; 270 s on an H100 timed 155
#   after its warm-up), afresh or with RESUME_FROM=<dir of an earlier call's draw/*.jsonl at the same src> going on.
#   Liger-Kernel for the draw's rival: carry explore/liger (the unzipped wheel: pending/README.md says how).
#   OUT=$OUT FUSELAB_REVISION=<the gated commit> PART=calls timeout 590 bash pending/next_results.sh
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-/tmp/next_results}; mkdir -p "$OUT"
export PYTHONPATH=src
if [ "${PART:-calls}" = draw ]; then
  liger=$([ -d explore/liger ] && echo "$PWD/explore/liger")
  [ -n "$liger" ] || echo "no explore/liger: the draw runs without its Liger rival (carry explore/liger)"
  OUT="$OUT/draw" RESUME_FROM=${RESUME_FROM:-} OPS=softmax N=200 SEED=2036 WARM_JOBS=15 LIGER=$liger \
    T_SOFTMAX=${T_SOFTMAX:-540} bash scripts/random_shapes.sh
  tail -5 "$OUT/draw/softmax_random.log"
  tar czf "$OUT/draw.tgz" -C "$OUT" draw && rm -rf "$OUT/draw"  # one file back (the device returns at most 8)
  exit 0
fi
timeout "${T_GUARDS:-300}" python3 benchmarks/compiled_guards.py --repeats 3 --out "$OUT/compiled_guards.json"
echo "compiled_guards rc=$?"
timeout "${T_MLP:-330}" python3 benchmarks/mlp_calls.py --modes eager,default,max-autotune-no-cudagraphs \
  --tokens 1,4099 --budget-ms 150 --out "$OUT/mlp_calls.json" > "$OUT/mlp_calls.log" 2>&1
echo "mlp_calls rc=$?"; grep -E "^ +[0-9]+ +(eager|default|max)" "$OUT/mlp_calls.log"
