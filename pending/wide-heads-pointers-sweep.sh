#!/usr/bin/env bash
# Heads past 128 (issue 25; docs/ops/attention.md, session 68: the backward of d 160 unmasked by pointers took
# 0.70x the TMA path's): TMA against pointers, forward and forward + backward (the backward's share: step -
# forward), both masks, five shapes of d 136-256 (about 200 s on an H100). To $OUT/wide_{fwd,step}.jsonl.
#   REV=<literal hash> OUT=$OUT bash pending/wide-heads-pointers-sweep.sh
set -uo pipefail
export PYTHONPATH=src FUSELAB_REVISION=${REV:?}
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
S="--shape 2x10x10x3000x3000x160 --shape 4x8x8x2048x2048x136 --shape 2x12x4x2500x2500x192 --shape 3x8x8x1777x1777x224
   --shape 1x16x16x4096x4096x256"
t0=$(date +%s)
timeout ${T_FWD:-70} python3 scripts/attention_plan_sweep.py --pointers --forward-only $S --causal both --rep-ms 20 \
  --out $OUT/wide_fwd.jsonl 2>&1 | grep -v Warning | grep -v "out = F" | tail -12
echo "fwd: $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout ${T_STEP:-120} python3 scripts/attention_plan_sweep.py --pointers $S --causal both --rep-ms 20 \
  --out $OUT/wide_step.jsonl 2>&1 | grep -v Warning | grep -v "out = F" | tail -12
echo "step: $(( $(date +%s) - t0 )) s"
