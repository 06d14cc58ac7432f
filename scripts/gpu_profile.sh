#!/usr/bin/env bash
# The profiling results of the lecture, made on the GPU by fuselab's own commands, from the repository root:
#   bash scripts/gpu_profile.sh [DIR]        (default: benchmarks/results/h200/profile)
# DIR/cases/<case>/      kernel table (table.txt, table.json), timeline.png, trace.json.gz of each lecture case
# DIR/<op>/             the same for every implementation of every registered op, at its profile shape
# DIR/runahead/          the run-ahead study: timeline_plain.png, timeline_print.png, runahead.json, traces
# DIR/inspect/           registers, spills, load widths (summary.txt, inspect.json) of the Triton and CUDA kernels
# DIR/h200_runahead_trace.json  a small run-ahead trace for the CPU tests: copy it to tests/data/
set -uo pipefail
DIR=${1:-benchmarks/results/h200/profile}
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
mkdir -p "$DIR"
status=0
fl() { echo "+ fuselab $*"; python3 -m fuselab "$@" || status=1; }

fl profile --case all --out "$DIR/cases"
OPS=$(python3 -c "from fuselab.ops import all_ops; print(' '.join(o.name for o in all_ops()))")
for op in $OPS; do  # each at its profile shape
  fl profile "$op" --impl all --out "$DIR/$op"
done
fl profile --runahead --steps 20 --layers 4 --dim 2048 --batch 2048 --out "$DIR/runahead"
fl profile --runahead --steps 4 --layers 2 --dim 2048 --batch 2048 --out "$DIR/runahead_small"
cp "$DIR/runahead_small/trace_plain.json" "$DIR/h200_runahead_trace.json" || status=1
for op in $OPS; do  # every impl that declares kernels (the summaries are kept; the PTX/SASS are not committed)
  for impl in $(python3 -c "from fuselab.ops import get_op; print(' '.join(n for n, i in get_op('$op').impls.items() if i.inspectable))"); do
    fl inspect "$op" --impl "$impl" --dtype float32 --out "$DIR/inspect/$op-$impl"
  done
done

# the traces open compressed in https://ui.perfetto.dev, and fuselab.profile.Trace.load reads .json.gz;
# the assembly listings (megabytes) are not kept: `fuselab inspect` writes them again
find "$DIR" -name 'trace*.json' -exec gzip -f {} +
find "$DIR/inspect" \( -name '*.ptx' -o -name '*.sass' -o -name '*.ttir' -o -name '*.ttgir' \) -delete
du -sh "$DIR"
exit $status
