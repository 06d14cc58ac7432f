#!/usr/bin/env bash
# sm90-table-fallback on an H100 (one device call, about 7-9 min): main against main + the patch, side by side
# (scripts/ab_trees.sh), bf16 attention forward + backward at 12 shapes (the leaderboard's, the issue's regime,
# heads of 64-224, 91 to 16 384 tokens), softmax and GELU at shapes of models' sizes. With the patch an H100 SXM
# (132 SMs, sm90) reads the H200's plan tables; without it, the rules' defaults.
#   OUT=$OUT FUSELAB_REVISION=<main> timeout 585 bash pending/sm90-table-fallback/time_it.sh
cd "$(dirname "$0")/../.." || exit 2
nvidia-smi --query-gpu=name --format=csv,noheader
A=(16x1x1x16384x16384x64 8x32x8x4228x4228x64 3x32x8x4148x4148x96 1x16x4x11589x11589x128 107x2x2x256x256x64
   20x4x4x1344x1344x128 26x8x8x1661x1661x96 10x8x8x1553x1553x80 209x8x8x91x91x64 15x16x4x1000x1000x64
   2x8x8x1500x1500x224 6x8x2x513x1029x112)
S=(61x50257 4096x771 129x5003 1434907x10 112x33024 2048x32000 30x134479 3x11008)
G=(33024 4000037 16777219 45088768)
BEFORE="" AFTER="pending/sm90-table-fallback/*.patch" T_RUN=${T_RUN:-130} bash scripts/ab_trees.sh \
  attention $(printf -- "--shape %s " "${A[@]}") --dtype bf16 --opt causal=true --backward \
    --impl triton,sdpa-cudnn --rep-ms 40 --warmup-ms 20 --rounds 2 --call-cost-ms 0 \
  --- softmax $(printf -- "--shape %s " "${S[@]}") --dtype fp32 --dtype bf16 --backward --impl torch,triton,cuda \
    --rep-ms 20 --rounds 2 --call-cost-ms 0 \
  --- gelu $(printf -- "--shape %s " "${G[@]}") --dtype fp32 --dtype bf16 --backward --impl torch,triton,cuda \
    --opt approximate=tanh --rep-ms 20 --rounds 2 --call-cost-ms 0
