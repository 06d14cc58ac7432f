#!/usr/bin/env bash
# The profiling results of the lecture, made on the GPU by fuselab's own commands, from the repository root:
#   bash scripts/gpu_profile.sh [DIR]        (default: benchmarks/results/h200/profile)
# DIR/cases/<case>/      kernel table (table.txt, table.json), timeline.png, trace.json.gz of each lecture case
# DIR/gelu/, DIR/softmax/  the same for every implementation of the ops
# DIR/runahead/          the run-ahead study: timeline_plain.png, timeline_print.png, runahead.json, traces
# DIR/inspect/           PTX, SASS, registers, spills and summary.txt of the Triton and CUDA kernels
# DIR/h200_runahead_trace.json  a small run-ahead trace for the CPU tests: copy it to tests/data/
set -uo pipefail
DIR=${1:-benchmarks/results/h200/profile}
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
mkdir -p "$DIR"
status=0
fl() { echo "+ fuselab $*"; python3 -m fuselab "$@" || status=1; }

fl profile --case all --out "$DIR/cases"
fl profile gelu --impl all --shape 2^24 --dtype float32 --out "$DIR/gelu"
fl profile softmax --impl all --shape 4096x4096 --dtype float32 --out "$DIR/softmax"
fl profile --runahead --steps 20 --layers 4 --dim 2048 --batch 2048 --out "$DIR/runahead"
fl profile --runahead --steps 4 --layers 2 --dim 2048 --batch 2048 --out "$DIR/runahead_small"
cp "$DIR/runahead_small/trace_plain.json" "$DIR/h200_runahead_trace.json" || status=1
fl inspect gelu --impl triton,cuda --dtype float32 --out "$DIR/inspect"
fl inspect gelu --impl triton,cuda --dtype bfloat16 --out "$DIR/inspect"
fl inspect softmax --impl triton,cuda --dtype float32 --out "$DIR/inspect"

# the traces open compressed in https://ui.perfetto.dev, and fuselab.profile.Trace.load reads .json.gz;
# the assembly listings (megabytes for the CUDA template instances) are kept compressed too
find "$DIR" -name 'trace*.json' -exec gzip -f {} +
find "$DIR/inspect" \( -name '*.ptx' -o -name '*.sass' -o -name '*.ttir' -o -name '*.ttgir' \) -exec gzip -f {} +
du -sh "$DIR"
exit $status
