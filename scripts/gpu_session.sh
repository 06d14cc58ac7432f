#!/usr/bin/env bash
# Everything a GPU run needs, in one command, from the repository root on the GPU machine:
#   bash scripts/gpu_session.sh STAGE...
# stages: env tests tune bench random callcost counters profile harness report   (each over every registered op)
# Results go to benchmarks/results/h200/ (committed afterwards); logs and a tarball of the results to $OUT.
# The bench and report stages measure anew (the committed logs they would resume from are removed first);
# RESUME=1 keeps them, to finish a run that was cut short. OPS="gelu softmax" limits the op stages to those ops;
# BENCH_ARGS adds arguments to every `fuselab bench` (e.g. "--rep-ms 100"), DTYPES replaces its dtypes; TESTS selects
# tests (e.g. "tests/ops"), TESTS_S caps their time.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext} MAX_JOBS=16
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
OUT=${OUT:-/tmp/out}
RES=${RES:-benchmarks/results/h200}
mkdir -p "$OUT" "$RES"
fl() { echo "+ fuselab $*"; python3 -m fuselab "$@"; }
fresh() { [ "${RESUME:-0}" = 1 ] || rm -rf "$@"; }
stage() { echo; echo "=== $1 ($(date +%T))"; }
OPS=${OPS:-$(python3 -c "from fuselab.ops import all_ops; print(' '.join(o.name for o in all_ops()))")}
tune_ops() {  # the ops that name a tuner (Op.tuner): the ones `fuselab tune` drives
  python3 -c "from fuselab.ops import get_op; print(' '.join(o for o in '$OPS'.split() if get_op(o).tuner))"
}
random_ops() { python3 -c "from fuselab.ops import get_op; print(' '.join(o for o in '$OPS'.split() if get_op(o).defaults.random_shape))"; }

for s in "$@"; do
  case "$s" in
    env)
      stage env
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
      python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
      fl device --refresh --out "$RES/device.json" ;;
    tests)
      stage "gpu tests"
      timeout ${TESTS_S:-420} python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 180 ${TESTS:-} 2>&1 \
        | tee "$OUT/pytest_gpu.log" | tail -40 ;;
    bench)
      for op in $OPS; do
        stage "bench $op"
        fresh "$RES/$op.jsonl"
        fl bench "$op" ${DTYPES:---dtype fp32 --dtype bf16} --out "$RES/$op.json" --plot "$RES/$op.png" ${BENCH_ARGS:-}
      done ;;
    random)
      for op in $(random_ops); do
        stage "random shapes $op"
        fresh "$RES/${op}_random.jsonl"
        fl bench "$op" --shapes random:${RANDOM_N:-200} --seed ${SEED:-20261130} --dtype fp32 --dtype bf16 \
          --out "$RES/${op}_random.json" --plot "$RES/${op}_random.png" ${RANDOM_ARGS:-}
      done ;;
    tune)  # prints each op's tuned plan table; TUNE_WRITE=1 writes it (the op's plans/<gpu>.json, copied to $RES/plans)
      for op in $(tune_ops); do
        stage "tune $op"
        if [ "${TUNE_WRITE:-0}" = 1 ]; then
          timeout 300 python3 -m fuselab tune "$op" ${TUNE_ARGS:-} 2>&1 | tee "$OUT/${op}_tune.log" | tail -40
          mkdir -p "$RES/plans/$op" && cp src/fuselab/ops/"$op"/plans/*.json "$RES/plans/$op/" 2>/dev/null
        else
          timeout 300 python3 -m fuselab tune "$op" --dry-run ${TUNE_ARGS:-} 2>&1 | tee "$OUT/${op}_tune.log" | tail -40
        fi
      done ;;
    callcost)
      stage "call cost"
      python3 benchmarks/call_cost.py --out "$RES/call_cost.json" 2>&1 | tee "$OUT/call_cost.log" | tail -40 ;;
    counters)
      stage "hardware counters"
      python3 benchmarks/counters_study.py --ceilings "$RES/device.json" --out "$RES/counters.json" 2>&1 | tail -40 ;;
    profile)
      stage profile
      bash scripts/gpu_profile.sh "$RES/profile" ;;
    harness)
      stage "timer cross-check"
      python3 benchmarks/crosscheck_timers.py --out "$RES/harness.json" ;;
    report)
      stage report
      fresh "$RES/report"
      mkdir -p "$RES/report/results"
      for op in $OPS; do  # an op's report sweep repeats cases of its bench stage: reuse its log
        [ -f "$RES/$op.jsonl" ] && cp -n "$RES/$op.jsonl" "$RES/report/results/$op.bench.jsonl"
      done
      fl report --out "$RES/report" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
  tar czf "$OUT/results.tgz" "$RES" 2>/dev/null  # after every stage: a run cut short still brings back its results
done
echo "=== done ($(date +%T))"
