#!/usr/bin/env bash
# The next device session's A/B (pending/README.md): every untimed series of pending/ timed against the tree with
# softmax-fixes 1-3 alone (timed in session 39), in one device call: attention's seed-11 draw (issue 25's
# attention-one-key-block), then the softmax shapes of triton-single-column and cuda-whole-span. drop-in-flat and
# declared-dtypes ride along in "after" (no bench measures them; benchmarks/compiled_guards.py does drop-in-flat's).
#   OUT=$OUT FUSELAB_REVISION=<main's commit> timeout 590 bash pending/next_ab.sh
# Once the series have landed (gated first), the same A/B with the tree as "after" and the series taken out as
# "before" (a diff made here, where git is: the device's copy has no .git):
#   git diff HEAD <the commit before the series> -- src > revert.diff
#   BEFORE=revert.diff AFTER= OUT=$OUT FUSELAB_REVISION=<rev> timeout 590 bash pending/next_ab.sh
cd "$(dirname "$0")/.." || exit 2
base="pending/softmax-fixes/000[1-3]-*.patch"
export BEFORE="${BEFORE-$base}" T_RUN=${T_RUN:-200}
export AFTER="${AFTER-$base pending/triton-single-column/*.patch pending/cuda-whole-span/*.patch
  pending/drop-in-flat/*.patch pending/declared-dtypes/*.patch pending/attention-one-key-block/*.patch
  pending/check-upstream/*.patch pending/check-in-pieces/*.patch pending/attention-fp32-tiles/*.patch}"
# After the benches, gradients against float64 on the after tree (a bench checks only the forward) where a new
# series is riskiest: attention's check shapes (N = 1, few keys: the one-key-block path) and three of the seed-11
# draw's shapes that take it. Last, so that a call cut at its limit loses these, not the A/B (the gate checks all).
export T_CHECK=${T_CHECK:-100} CHECKS=${CHECKS-"attention --impl triton; attention --impl triton --dtype bf16
  --shape 768x1x1x87x2x80 --shape 1x64x8x333x1x80 --shape 1087x2x2x12x9243x96 --opt causal=true"}
exec bash scripts/ab_trees.sh attention --shapes random:40 --seed 11 --backward --dtype bf16 --opt causal=true \
  --impl triton,sdpa-cudnn --rep-ms 10 --warmup-ms 5 --rounds 1 --call-cost-ms 0 \
  --- softmax --shape 20313320x1 --shape 15646710x1 --shape 686556x1 --shape 123457x1 --shape 21250x1741 \
  --shape 9631x1720 --shape 52x32000 --shape 125x50086 --shape 8756x677 --backward --cuda-graph \
  --impl torch,triton,cuda --dtype fp32 --dtype bf16 --rep-ms 5 --warmup-ms 2 --rounds 1 --call-cost-ms 0
