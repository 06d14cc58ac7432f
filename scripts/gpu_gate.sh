#!/usr/bin/env bash
# The GPU gate (src/fuselab/gate): run it on the final revision before every landing of code the GPU runs, on a
# machine with an NVIDIA GPU, from anywhere in the repository:
#   bash scripts/gpu_gate.sh                     (or: make gpu-gate)
#   FUSELAB_REVISION=<commit> bash scripts/gpu_gate.sh    where the tree is a copy without .git (the device tool's)
# It writes benchmarks/results/<gpu>/gate.json (commit it) and its logs to $OUT (or gate-logs/); exit 1 on any
# failure. Arguments go to `python -m fuselab.gate` (e.g. --groups check,compile for a partial run while debugging).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext} MAX_JOBS=${MAX_JOBS:-16}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}  # many processes compile at once
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
LOGS=${OUT:-gate-logs}
mkdir -p "$LOGS"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv | tee "$LOGS/nvidia_smi.csv"
# The C and CUDA extensions built first, side by side, out of the gate's budget (scripts/build_extensions.sh). Left to
# the gate, the first tests needing them wait on those builds: on a cold machine on 2026-12-04 the GPU suite ran past
# its 480 s budget; with the extensions built, the whole gate took 384 s. FUSELAB_PREBUILD=0 skips this.
[ "${FUSELAB_PREBUILD:-1}" = 1 ] && bash scripts/build_extensions.sh "$LOGS"
timeout "${GATE_S:-570}" "${PYTHON:-python3}" -m fuselab.gate --logs "$LOGS" "$@"
