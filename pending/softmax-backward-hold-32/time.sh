#!/usr/bin/env bash
# One device call (about 170 s of work on an H100, session 68): (1) main's src against main + this series under the
# tables' backward_hold 16 (`scripts/ab_trees.sh`, main once more after: the machine's drift); (2) on the A/B's
# patched tree and build, backward_hold 16 / 32 / 24 at 26 shapes, fp32 bf16 fp16, beside Liger
# (`scripts/softmax_variants.sh`, IMPLS=cuda,liger). Everything to $OUT (ab.tgz, variants.tgz). Carry explore/liger.
#   REV=<literal hash> CALL_S=300 OUT=$OUT bash pending/softmax-backward-hold-32/time.sh
set -uo pipefail
REV=${REV:?}; ROOT=$PWD; T_START=${T_START:-$(date +%s)}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
SH="--shape 305x11008 --shape 16x16384 --shape 3x28672 --shape 1013x3072 --shape 6x11008 --shape 21x13001
    --shape 5000x9000 --shape 1024x4100 --shape 77x22937"
OUT=$OUT FUSELAB_REVISION=$REV AFTER="pending/softmax-backward-hold-32/*.patch" AGAIN=1 \
  T_RUN=60 timeout 170 bash scripts/ab_trees.sh softmax $SH --dtype bf16 --dtype fp16 --impl cuda --cuda-graph \
  --backward --rep-ms 5 --warmup-ms 2 --rounds 1 --call-cost-ms 0 2>&1 | tail -70
echo "ab: $(( $(date +%s) - T_START )) s"
cd /tmp/ab-trees/after || exit 1
T_BENCH=$(( (${CALL_S:-300} - $(date +%s) + T_START - 15) / 3 ))
[ "$T_BENCH" -ge 30 ] || T_BENCH=30  # each variant at least 30 s (`timeout 0` would be no limit at all)
FUSELAB_EXT_DIR=/tmp/ab-trees/ext-after LIGER=$ROOT/explore/liger FUSELAB_REVISION=$REV+hold32 \
  TABLE=src/fuselab/ops/softmax/plans/nvidia-h200-sm90.json DTYPES="fp32 bf16 fp16" IMPLS=cuda,liger MEASURED=cuda \
  T_BENCH=$T_BENCH OUT=$OUT \
  SHAPES="305x11008 1013x3072 150x12000 16x16384 42x32000 777x6000 6x11008 8x7600 179x4096 3308x3072 2x50257
  64x50257 30000x2048 4000x4096 1500x1500 100x5000 239x3089 200x2047 341x1647 287x1025 3x28672 392x784
  21x13001 5000x9000 77x22937 1024x4100" \
  VARIANTS='base:{} bhold32:{"cuda_spans":{"backward_hold":32}} bhold24:{"cuda_spans":{"backward_hold":24}}' \
  bash "$ROOT/scripts/softmax_variants.sh" 2>&1 | tail -200
echo "variants: $(( $(date +%s) - T_START )) s"
