#!/usr/bin/env bash
# Issue 27's non-contiguous target on a GPU: each op's impls (torch, triton, cuda) on random shapes in the contiguous,
# transposed and sliced layouts, side by side, forward and forward + backward, CUDA-graph replays. `fuselab bench`
# prints and keeps (meta `layout_ratios`) each layout's time over the impl's contiguous time plus what the layout adds
# to the PyTorch built-in's time (docs/ops/gelu.md, docs/ops/softmax.md).
#   FUSELAB_REVISION=<commit> N=20 SEED=2038 OUT=/tmp/layouts bash scripts/layouts.sh
# Writes <op>_layouts.json (+ .jsonl log, .log) under OUT; OPS (default "softmax gelu"), DTYPES (default "fp32 bf16
# fp16"); each op bounded by T_OP seconds (a cut run keeps its .jsonl; the same command again resumes from it).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-src}
OUT=${OUT:-/tmp/layouts}; N=${N:-20}; SEED=${SEED:-2038}
mkdir -p "$OUT"
# The CUDA extensions first, with no timeout: a build killed midway leaves cpp_extension's lock file, and the next
# process waits on it (2026-12-04: a bench after a killed pytest wrote nothing in 160 s).
python3 -c "from fuselab.ops.gelu import cuda as g; from fuselab.ops.softmax import cuda as s; g.extension(); s.extension()"
echo "extensions rc=$?"
DTYPE_ARGS=()
for d in ${DTYPES:-fp32 bf16 fp16}; do DTYPE_ARGS+=(--dtype "$d"); done
for op in ${OPS:-softmax gelu}; do
  options=()
  [ "$op" = gelu ] && options=(--opt approximate=tanh)
  timeout "${T_OP:-200}" python3 -m fuselab bench "$op" "${options[@]}" --shapes "random:$N" --seed "$SEED" \
    --backward --cuda-graph --impl torch,triton,cuda "${DTYPE_ARGS[@]}" \
    --layout contiguous --layout transposed --layout sliced \
    --rep-ms 5 --warmup-ms 2 --rounds 1 --call-cost-ms 0 --out "$OUT/${op}_layouts.json" > "$OUT/${op}_layouts.log" 2>&1
  echo "$op layouts rc=$?"
  grep -A40 "copy torch makes" "$OUT/${op}_layouts.log" | cut -c1-150
done
