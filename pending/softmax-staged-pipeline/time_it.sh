#!/usr/bin/env bash
# softmax-staged-pipeline on a GPU, in one device call (about 8 min), on main with or without pending/land-next
# landed: the series not yet in the tree are applied (land-next first, then this one) and put back at the end. The
# extension is built, the new GPU test runs (the pipelined forward against float64, bitwise twice), then
# scripts/softmax_variants.sh times the cuda impl (the H200's table, which an H100 reads; CUDA graphs, fp32 and bf16)
# with the rule off (`base`), at 4 blocks an SM and at 2, beside torch, at narrow staged shapes.
#   EXT_TGZ=explore/ext_s57.tgz OUT=$OUT FUSELAB_REVISION=<rev> timeout 560 bash pending/softmax-staged-pipeline/time_it.sh
# Land it (the table's staged_pipeline_blocks_per_sm set to the winner) if it gains at the many-tile shapes and no
# case is slower past 2%; then one gate for both series.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext}; mkdir -p "$FUSELAB_EXT_DIR"
[ -n "${EXT_TGZ:-}" ] && [ -f "$EXT_TGZ" ] && tar xzf "$EXT_TGZ" -C "$(dirname "$FUSELAB_EXT_DIR")"
applied=()
for p in pending/land-next/*.patch pending/softmax-staged-pipeline/*.patch; do
  [ -f "$p" ] && git apply --check "$p" 2>/dev/null && git apply "$p" && applied=("$p" "${applied[@]}")
done
trap 'for p in "${applied[@]}"; do git apply -R "$p"; done' EXIT
echo "applied: ${applied[*]:-none}"
left() { echo $(( ${BOUND:-550} - $(date +%s) + T0 )); }
s=$(date +%s)
PYTHONPATH=src python3 -c "from fuselab.ops.softmax import cuda; cuda.extension()" 2>&1 | tail -3
echo "extension built in $(( $(date +%s) - s )) s; $(left) s left"
PYTHONPATH=src timeout 90 python3 -m pytest -q -m gpu tests/ops/test_softmax.py -k "staged" 2>&1 | tail -3
export TABLE=src/fuselab/ops/softmax/plans/nvidia-h200-sm90.json MEASURED=cuda DTYPES="fp32 bf16" IMPLS=torch,cuda
export SHAPES=${SHAPES:-"1434907x10 5909110x10 279197x30 105063x31 415086x12 57801x20 8682249x2 1322659x4 1439492x19
392652x17 1317129x11 4480121x3 4038158x11 777777x6 333331x27 98765x38 2000003x5 654321x23"}
export VARIANTS=${VARIANTS:-'base:{} pipe4:{"cuda_spans":{"staged_pipeline_blocks_per_sm":4}}
pipe2:{"cuda_spans":{"staged_pipeline_blocks_per_sm":2}}'}
n=$(echo $VARIANTS | wc -w); T=$(( ($(left) - 15) / n )); [ "$T" -gt 130 ] && T=130
OUT="$OUT/variants" T_BENCH=$T bash scripts/softmax_variants.sh | tail -80
echo "done, $(left) s left"
