#!/usr/bin/env bash
# softmax-values-a-thread timed: the series applied to this tree (patch(1); the device's tree has no .git), then
# `scripts/softmax_variants.sh` with the Triton impl measured under the H200's table (which the H100 reads) and the
# rule's values side by side: off (the table as it is), forward 16, backward 32, backward rows whole to 32 768 at 32;
# torch and Liger-Kernel beside (carry explore/liger), fp32 bf16 fp16, forward and forward + backward, CUDA-graph
# replays. Shapes: the draw's losses to Liger (docs/ops/softmax.md, "Values a thread"), then eleven of our own that
# the rule's values change or border. About 4-5 min on an H100 (no builds). Everything to $OUT/variants.tgz.
#   REV=<literal hash> OUT=$OUT bash pending/softmax-values-a-thread/time.sh
set -uo pipefail
REV=${REV:?}; ROOT=$PWD
[ -d explore/liger ] || echo "no explore/liger: Liger-Kernel does not run beside (carry explore/liger)"
patch -p1 --forward -s < "$(ls pending/softmax-values-a-thread/0001-*.patch)" || { echo "the patch did not apply"; exit 2; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
LIGER=$([ -d explore/liger ] && echo "$ROOT/explore/liger") FUSELAB_REVISION=$REV+values OUT=$OUT \
  TABLE=src/fuselab/ops/softmax/plans/nvidia-h200-sm90.json DTYPES="fp32 bf16 fp16" IMPLS=torch,triton,liger \
  MEASURED=triton T_BENCH=${T_BENCH:-120} \
  SHAPES="6397x851 3308x3072 305x11008 3x28672 42x32000 120000x100 30000x500 777x1000 1500x3000 250x6000 100x8000
  60x12000 2000x9000 12x20000 150x24000 10000x2100" \
  VARIANTS='off:{} fwd16:{"forward_values":16} bwd32:{"backward_values":32}
  bwd32whole:{"backward_values":32,"backward_row_max":32768}' \
  bash scripts/softmax_variants.sh 2>&1 | tail -150
