#!/usr/bin/env bash
# cuda-narrow-candidate on a GPU, in one device call (about 9 min; on main, the patch NOT applied). Three runs of
# scripts/softmax_variants.sh (the H200's softmax table, which an H100 reads too), CUDA graphs, fp32 and bf16:
#   1. main as it is: the cuda impl beside torch, torch.compile and triton (the peers);
#   2. main + the patch, its (b) in every variant: `base` (staged_lane_columns 0) and `lane16`, torch and cuda only;
#   3. `lane8`, if time is left.
# Run 1's cuda against run 2's base is (b) alone; base against lane16 and lane8 is (a).
#   EXT_TGZ=explore/ext_s57.tgz OUT=$OUT FUSELAB_REVISION=<rev> timeout 570 bash pending/cuda-narrow-candidate/time_it.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
T0=$(date +%s); OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext}; mkdir -p "$FUSELAB_EXT_DIR"
[ -n "${EXT_TGZ:-}" ] && [ -f "$EXT_TGZ" ] && tar xzf "$EXT_TGZ" -C "$(dirname "$FUSELAB_EXT_DIR")"
export TABLE=src/fuselab/ops/softmax/plans/nvidia-h200-sm90.json MEASURED=cuda DTYPES="fp32 bf16"
export SHAPES="1434907x10 5909110x10 279197x30 105063x31 415086x12 189101x8 57801x20 8682249x2 1322659x4 62702x5
1439492x19 392652x17 1317129x11 4480121x3 4038158x11 777777x6 1434907x11 333331x27 98765x38"
left() { echo $(( ${BOUND:-560} - $(date +%s) + T0 )); }
OUT="$OUT/main" IMPLS=torch,compile,triton,cuda T_BENCH=${T_MAIN:-200} VARIANTS='main:{}' \
  bash scripts/softmax_variants.sh | tail -80
git apply pending/cuda-narrow-candidate/staged-lanes-and-warp-groups.patch || exit 1
trap 'git apply -R pending/cuda-narrow-candidate/staged-lanes-and-warp-groups.patch' EXIT
s=$(date +%s)
PYTHONPATH=src python3 -c "from fuselab.ops.softmax import cuda; cuda.extension()" 2>&1 | tail -3
echo "patched extension built in $(( $(date +%s) - s )) s; $(left) s left"
T=$(( ($(left) - 20) / 2 )); [ "$T" -gt 110 ] && T=110
OUT="$OUT/patched" IMPLS=torch,cuda T_BENCH=$T \
  VARIANTS='base:{} lane16:{"cuda_spans":{"staged_lane_columns":16}}' bash scripts/softmax_variants.sh | tail -80
T=$(( $(left) - 15 ))
[ "$T" -gt 60 ] && OUT="$OUT/lane8" IMPLS=torch,cuda T_BENCH=$T \
  VARIANTS='lane8:{"cuda_spans":{"staged_lane_columns":8}}' bash scripts/softmax_variants.sh | tail -80
echo "done, $(left) s left"
