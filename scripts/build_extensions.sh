#!/usr/bin/env bash
# Build fuselab's compiled extensions ahead of the code that needs them: every module of fuselab.ops with an
# `extension()` (the CUDA impls), and the launcher's C module and replays, each in a process of its own, side by
# side, into $FUSELAB_EXT_DIR (cpp_extension's cache: an extension whose sources did not change is loaded, not
# rebuilt). Left to the first test or bench that needs them, the builds wait on each other and count against that
# run's timeout; a build killed midway leaves cpp_extension's lock, and the next process waits on it.
#   FUSELAB_EXT_DIR=/tmp/fuselab-ext bash scripts/build_extensions.sh [LOGS]     (LOGS: a folder, one log a build)
# SRC: the fuselab source tree to build from (default this tree's src/; scripts/ab_trees.sh builds copies).
set -uo pipefail
SRC=${SRC:-"$(cd "$(dirname "$0")/.." && pwd)/src"}
LOGS=${1:-/tmp/fuselab-build-logs}
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}" MAX_JOBS=${MAX_JOBS:-16}
mkdir -p "$LOGS"
t0=$(date +%s)
builders=$("${PYTHON:-python3}" - <<'PY'
import importlib, pkgutil
import fuselab.ops as ops
names = ["fuselab.ops.launcher:replays_module"]
for info in pkgutil.walk_packages(ops.__path__, "fuselab.ops."):
    try:
        if callable(getattr(importlib.import_module(info.name), "extension", None)):
            names.append(f"{info.name}:extension")
    except Exception:  # a module that needs what this machine lacks: its first user reports it
        pass
print(" ".join(names))
PY
)
for builder in $builders; do
  "${PYTHON:-python3}" -c "import importlib; m, f = '$builder'.split(':'); getattr(importlib.import_module(m), f)()" \
    > "$LOGS/build_${builder//[:.]/_}.log" 2>&1 &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=$((failed + 1)); done
echo "extensions built ($builders) into ${FUSELAB_EXT_DIR:-~/.cache/fuselab/ext}:" \
  "$(( $(date +%s) - t0 )) s, $failed failed"
