#!/usr/bin/env bash
# The padded heads' forward rule checked at d 33-40 shapes it was not chosen on, bf16 forward, both masks: the
# series (and attention-mends, under it) applied to the device's copy of the tree (APPLY=0: the tree has them, as in
# the gate's call after `git am`), then "plan" (the rule's, fitted) against the d-64 key's 64x128x4x2 forced. To
# $OUT/check_fwd.jsonl.
#   REV=<literal hash> OUT=$OUT [APPLY=0] bash pending/attention-padded-head-forward/check.sh
set -uo pipefail
if [ "${APPLY:-1}" = 1 ]; then
  for f in pending/attention-mends/*.patch pending/attention-padded-head-forward/*.patch; do
    patch -p1 -s --no-backup-if-mismatch < "$f" || exit 2
  done
fi
S="--shape 2x8x8x1024x1024x40 --shape 3x8x8x2304x77x40 --shape 5x6x3x1777x1777x36 --shape 1x12x12x9000x9000x34
   --shape 8x5x5x1200x1200x40"
PYTHONPATH=src FUSELAB_REVISION=${REV:?} timeout ${T_CHECK:-50} python3 scripts/attention_plan_sweep.py \
  --forward-only --kernel fwd --plans 64x128x4x2 $S --causal both --rep-ms 25 --out "$OUT/check_fwd.jsonl" 2>&1 \
  | tail -12
