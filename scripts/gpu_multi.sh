#!/usr/bin/env bash
# The many-GPU checks, on the lent 2-GPU H200 machine, from the repository root, in one command (~5 minutes):
#   bash scripts/gpu_multi.sh
# 1. `fuselab device`: the GPU's ceilings plus the interconnect (copy GB/s per GPU pair, NCCL all-reduce busbw
#    8 KiB..1 GiB, nvidia-smi topo -m), NVLink multicast off (NCCL_NVLS_ENABLE=0);
# 2. benchmarks/interference.py: each case timed alone, with all GPUs timing at once, and next to busy GPUs;
# 3. one sweep (softmax bf16, 4 impls x 10 shapes = 40 cases) on 1 GPU, then on 2 (`--gpus 2`, torchrun), each in
#    fresh Triton/Inductor caches, each run again once complete (the fixed cost: start-up, ceilings, table);
#    `fuselab compare` checks every case is present once and the winners agree, and the speed-ups.
# Results to benchmarks/results/h200x2/ (committed afterwards) and copies to $OUT.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 COLUMNS=160
export FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext}
OUT=${OUT:-/tmp/out}
RES=benchmarks/results/h200x2
mkdir -p "$OUT" "$RES"
stage() { echo; echo "=== $1 ($(date +%T))"; }
now() { date +%s.%N; }
START=$(now)

stage env
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
nvidia-smi topo -m | tee "$RES/topo.txt"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.device_count(), 'GPUs')"

stage "device + interconnect"
timeout 150 python3 -m fuselab device --refresh --out "$RES/device.json" 2>&1 | tee "$OUT/device.log" | tail -45

stage interference
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/interference.py \
  --op softmax:torch:bf16:8192x4096 --op softmax:triton:bf16:8192x4096 --out "$RES/interference.json" \
  2>&1 | grep -v '^\*\|OMP_NUM_THREADS' | tee "$OUT/interference.log"

SHAPES=(4096x1000 4096x3000 2048x7000 2048x12000 1024x20000 512x50257 8192x768 16384x513 3000x4096 1500x9999)
SWEEP=(bench softmax --dtype bf16 --impl naive,torch,compile,triton --rep-ms 100 --warmup-ms 100)
for s in "${SHAPES[@]}"; do SWEEP+=(--shape "$s"); done
declare -A WALL
sweep() {  # name, extra args...: a fresh log and fresh compile caches, timed; then the same command once more
  local name=$1; shift
  rm -f "$RES/sweep_$name".json* "$RES/sweep_$name".rank*.jsonl
  export TRITON_CACHE_DIR=/tmp/triton-$name TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-$name
  rm -rf "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
  local t0; t0=$(now)
  timeout 200 python3 -m fuselab "$@" "${SWEEP[@]}" --out "$RES/sweep_$name.json" 2>&1 \
    | grep -v '^\*\|OMP_NUM_THREADS' | tee "$OUT/sweep_$name.log" | tail -50
  WALL[$name]=$(python3 -c "print(round($(now) - $t0, 2))")
  t0=$(now)
  timeout 60 python3 -m fuselab "$@" "${SWEEP[@]}" --out "$RES/sweep_$name.json" > "$OUT/sweep_${name}_resume.log" 2>&1
  WALL[${name}_resume]=$(python3 -c "print(round($(now) - $t0, 2))")
  echo "wall $name: ${WALL[$name]} s (the same command once complete: ${WALL[${name}_resume]} s)"
}
stage "sweep on 1 GPU"
sweep 1gpu
stage "sweep on 2 GPUs"
sweep 2gpu --gpus 2

stage summary
python3 -m fuselab compare "$RES/sweep_1gpu.json" "$RES/sweep_2gpu.json" \
  --walls "one=${WALL[1gpu]},one_resume=${WALL[1gpu_resume]},many=${WALL[2gpu]},many_resume=${WALL[2gpu_resume]}" \
  --out "$RES/sweep_summary.json"
rm -f "$RES"/*.lock
cp "$RES/device.json" "$RES/interference.json" "$RES/sweep_summary.json" "$RES/topo.txt" "$OUT/" 2>/dev/null
tar czf "$OUT/h200x2.tgz" "$RES" 2>/dev/null
echo "total $(python3 -c "print(round($(now) - $START))") s"
