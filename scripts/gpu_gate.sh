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
# The C and CUDA extensions built first, each in a process of its own, side by side, out of the gate's budget (and of
# any timeout: a build killed midway leaves cpp_extension's lock, and the next process waits on it). Left to the
# gate, the first tests needing them wait on those builds: on a cold machine on 2026-12-04 the GPU suite ran past
# its 480 s budget; with the extensions built, the whole gate took 384 s. Every module of fuselab.ops with an
# `extension()` is built, and the launcher's C module and replays. FUSELAB_PREBUILD=0 skips this.
if [ "${FUSELAB_PREBUILD:-1}" = 1 ]; then
  t0=$(date +%s)
  builders=$("${PYTHON:-python3}" - <<'PY'
import importlib, pkgutil
import fuselab.ops as ops
names = ["fuselab.ops.launcher:replays_module"]
for info in pkgutil.walk_packages(ops.__path__, "fuselab.ops."):
    try:
        if callable(getattr(importlib.import_module(info.name), "extension", None)):
            names.append(f"{info.name}:extension")
    except Exception:  # a module that needs what this machine lacks: the gate reports it
        pass
print(" ".join(names))
PY
)
  for builder in $builders; do
    "${PYTHON:-python3}" -c "import importlib; m, f = '$builder'.split(':'); getattr(importlib.import_module(m), f)()" \
      > "$LOGS/build_${builder//[:.]/_}.log" 2>&1 &
  done
  wait
  echo "extensions built first ($builders): $(( $(date +%s) - t0 )) s"
fi
timeout "${GATE_S:-570}" "${PYTHON:-python3}" -m fuselab.gate --logs "$LOGS" "$@"
