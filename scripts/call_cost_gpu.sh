#!/usr/bin/env bash
# The call-cost run on a GPU machine (issue 18): builds the CUDA extensions of the package before and after the
# change in parallel, runs the GPU tests of the dispatch path, then benchmarks/call_cost.py (eager before/after,
# the launch-bound study, the small MLP) on a quiet machine. Usage: scripts/call_cost_gpu.sh OUT_DIR BEFORE_SRC
set -u
OUT=${1:?OUT_DIR}
BEFORE=${2:?BEFORE_SRC (a copy of src/ before the change)}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
build() {  # build(src, ext_dir, op)
  PYTHONPATH=$1 FUSELAB_EXT_DIR=$2 $PY -c "import fuselab.ops; from fuselab.ops.$3.cuda import extension; extension()"
}
start=$(date +%s)
for op in gelu softmax; do
  build src /tmp/ext-after $op > "$OUT/build-after-$op.log" 2>&1 &
  build "$BEFORE" /tmp/ext-before $op > "$OUT/build-before-$op.log" 2>&1 &
done
export PYTHONPATH=src FUSELAB_EXT_DIR=/tmp/ext-after
{
  $PY -m pytest -q -m gpu tests/ops/test_library.py tests/bench/test_timer.py -p no:cacheprovider
  $PY -m pytest -q -m "gpu and not slow" tests/ops/test_gelu.py tests/ops/test_softmax.py -p no:cacheprovider \
    -k "opcheck or compiles or errors"
} > "$OUT/tests.log" 2>&1
wait
echo "tests and builds: $(($(date +%s) - start)) s" >> "$OUT/tests.log"
{
  $PY benchmarks/call_cost.py eager --label after --out "$OUT/after.json"
  PYTHONPATH=$BEFORE FUSELAB_EXT_DIR=/tmp/ext-before $PY benchmarks/call_cost.py eager --label before \
    --harness src/fuselab/bench/timer.py --out "$OUT/before.json"
  $PY benchmarks/call_cost.py study --out "$OUT/study.json" --deadline-s "${STUDY_DEADLINE_S:-60}"
} > "$OUT/bench.log" 2>&1
echo "total: $(($(date +%s) - start)) s" >> "$OUT/bench.log"
cat "$OUT"/build-*.log | grep -i error | head -20 >> "$OUT/tests.log"
rm -f "$OUT"/build-*.log
tail -5 "$OUT/tests.log"; grep -E "^(before|after) " "$OUT/bench.log"
