#!/usr/bin/env bash
# The every-shape draws on a GPU (issues 16, 27): softmax and GELU over random shapes drawn with a seed the plans were
# not tuned on; each impl's GPU time (CUDA-graph replays) over the best of its peers (torch, torch.compile) and of its
# rivals (Liger-Kernel's softmax, where LIGER names its unzipped wheel), forward and forward + backward, fp32, bf16
# and fp16. The compiles run first in WARM_JOBS processes (`--warm-jobs`). Resumable: the same command again goes on
# from the .jsonl logs beside the .json files (RESUME_FROM: a folder of an earlier call's logs, copied in first).
# OPS: which draws (default "softmax gelu"), each bounded by T_SOFTMAX / T_GELU seconds. Writes under $OUT (default
# /tmp/random_shapes).
#   FUSELAB_REVISION=<commit> N=200 SEED=2031 WARM_JOBS=14 LIGER=/tmp/liger scripts/random_shapes.sh
# (FUSELAB_REVISION: the commit the rows record; the GPU machine's copy of the tree may carry a stale git HEAD.)
set -u
OUT=${OUT:-/tmp/random_shapes}; N=${N:-200}; SEED=${SEED:-2031}
SOFTMAX_IMPLS=${SOFTMAX_IMPLS:-torch,compile,triton,cuda${LIGER:+,liger}}
GELU_IMPLS=${GELU_IMPLS:-torch,compile,triton,cuda}
[ -n "${LIGER:-}" ] && export PYTHONPATH="${PYTHONPATH:-src}:$LIGER"
mkdir -p "$OUT"
[ -n "${RESUME_FROM:-}" ] && cp -n "$RESUME_FROM"/*.jsonl "$OUT"/ 2>/dev/null
COMMON=(--shapes "random:$N" --seed "$SEED" --backward --cuda-graph --dtype fp32 --dtype bf16 --dtype fp16
        --rep-ms "${REP_MS:-5}" --warmup-ms 2 --rounds 1 --call-cost-ms 0 --warm-jobs "${WARM_JOBS:-14}")
if [[ " ${OPS:-softmax gelu} " == *" softmax "* ]]; then
  timeout "${T_SOFTMAX:-300}" python3 -m fuselab bench softmax --impl "$SOFTMAX_IMPLS" "${COMMON[@]}" \
    --out "$OUT/softmax_random.json" --plot "$OUT/softmax_random.png" > "$OUT/softmax_random.log" 2>&1
  echo "softmax random rc=$?"
fi
if [[ " ${OPS:-softmax gelu} " == *" gelu "* ]]; then
  timeout "${T_GELU:-200}" python3 -m fuselab bench gelu --impl "$GELU_IMPLS" --opt approximate=tanh "${COMMON[@]}" \
    --out "$OUT/gelu_random.json" --plot "$OUT/gelu_random.png" > "$OUT/gelu_random.log" 2>&1
  echo "gelu random rc=$?"
fi
