#!/usr/bin/env bash
# recipe-output-strides on a GPU, before its gate (about 2 min with EXT_TGZ): apply the patch to a copy of this tree,
# build the extensions, run the launcher's and attention's replay tests, and time the host's µs a call of attention's
# forward on q, k, v sliced from one projection (O in q's order) against contiguous ones, replays on and off.
#   EXT_TGZ=explore/ext_s59.tgz OUT=$OUT bash pending/recipe-output-strides/check_it.sh   (carry the tgz)
set -u
cd "$(dirname "$0")/../.."; OUT=${OUT:-/tmp/out}; HERE=$PWD
rm -rf /tmp/strides-tree && cp -r "$HERE" /tmp/strides-tree && cd /tmp/strides-tree
git apply pending/recipe-output-strides/*.patch || { echo "the patch does not apply"; exit 1; }
export PYTHONPATH=src FUSELAB_EXT_DIR=/tmp/fuselab-ext MAX_JOBS=16
nvidia-smi --query-gpu=name --format=csv,noheader
[ -n "${EXT_TGZ:-}" ] && tar xzf "$HERE/$EXT_TGZ" -C /tmp
t0=$(date +%s); bash scripts/build_extensions.sh "$OUT/build" > /dev/null 2>&1; echo "built in $(( $(date +%s) - t0 )) s"
timeout "${T:-150}" python3 -m pytest -m gpu -q -n 6 tests/ops/test_launcher.py tests/ops/test_library.py \
  tests/ops/test_attention.py -k "replay or recipe or projection or launcher or library" 2>&1 | tail -15
timeout 30 python3 pending/recipe-output-strides/host_calls.py 2>&1 | tail -6
