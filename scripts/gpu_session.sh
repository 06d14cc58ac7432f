#!/usr/bin/env bash
# Everything the H200 run needs, in one command, from the repository root on the GPU machine:
#   bash scripts/gpu_session.sh STAGE...      stages: env tests tune check gelu softmax harness profile report
# Results go to benchmarks/results/h200/ (committed afterwards); logs and a tarball of the results to $OUT.
# The bench and report stages measure anew (the committed logs they would resume from are removed first);
# RESUME=1 keeps them, to finish a run that was cut short.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext} MAX_JOBS=16
OUT=${OUT:-/tmp/out}
RES=benchmarks/results/h200
mkdir -p "$OUT" "$RES"
py() { python3 "$@"; }
fresh() { [ "${RESUME:-0}" = 1 ] || rm -rf "$@"; }
stage() { echo; echo "=== $1 ($(date +%T))"; }

for s in "$@"; do
  case "$s" in
    env)
      stage env
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
      py -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
      py -m fuselab device --refresh --out "$RES/device.json" ;;
    tests)
      stage "gpu tests"
      timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider --timeout 180 2>&1 | tee "$OUT/pytest_gpu.log" | tail -60 ;;
    tune)
      stage "softmax tuner"
      timeout 200 python3 -m fuselab tune softmax --dry-run ${TUNE_ARGS:-} 2>&1 | tee "$OUT/softmax_tune.log" | tail -80 ;;
    check)
      stage check
      py -m fuselab check gelu --out "$RES/check_gelu.json" | tail -30
      py -m fuselab check softmax --out "$RES/check_softmax.json" | tail -30 ;;
    gelu)
      stage "bench gelu"
      fresh "$RES/gelu.jsonl"
      py -m fuselab bench gelu --shape 2^24 --shape 2^26 --shape 2^28 --dtype fp32 --dtype bf16 \
        --opt approximate=tanh --out "$RES/gelu.json" --plot "$RES/gelu.png" ;;
    softmax)
      stage "bench softmax"
      fresh "$RES/softmax.jsonl"
      py -m fuselab bench softmax --dtype fp32 --dtype bf16 --rep-ms 200 --out "$RES/softmax.json" --plot "$RES/softmax.png" ;;
    harness)
      stage "timer cross-check"
      py benchmarks/crosscheck_timers.py --out "$RES/harness.json" ;;
    profile)
      stage profile
      bash scripts/gpu_profile.sh "$RES/profile" ;;
    report)
      stage report
      fresh "$RES/report"
      # the GELU and softmax sweeps of the report are the same cases as the bench stages': reuse their logs
      mkdir -p "$RES/report/results"
      [ -f "$RES/gelu.jsonl" ] && cp -n "$RES/gelu.jsonl" "$RES/report/results/gelu.bench.jsonl"
      [ -f "$RES/softmax.jsonl" ] && cp -n "$RES/softmax.jsonl" "$RES/report/results/softmax.bench.jsonl"
      py -m fuselab report --out "$RES/report" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
  tar czf "$OUT/results.tgz" "$RES" 2>/dev/null  # after every stage: a run cut short still brings back its results
done
echo "=== done ($(date +%T))"
