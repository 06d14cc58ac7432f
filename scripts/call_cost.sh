#!/usr/bin/env bash
# The cost of a call on a GPU: host and end-to-end us per back-to-back call of the GELU and softmax impls beside
# PyTorch's (the impl "torch"), forward and forward + backward, launched by fuselab's launcher and, in a second run,
# by Triton itself (FUSELAB_LAUNCHER=triton), and attention's beside SDPA's (bf16: TMA descriptors, encoded by the
# launcher; fp32: pointers); then end to end against size (odd sizes up to 2^22 elements, forward).
#   TRITON_LAUNCH=0 skips the second run (Triton's own launch).
#   OUT=/tmp/out bash scripts/call_cost.sh
# Writes to $OUT: call_cost_{gelu,softmax,attention}.json, call_cost_{gelu,softmax,attention}_triton.json (Triton's
# launch), call_cost_{gelu,softmax}_sizes.json and .png. docs/call-cost.md reads them. (The attention runs were
# added after the committed files were made at 787567b.)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=src
bench() { timeout "${CASE_S:-240}" python3 -m fuselab bench "$@" > "$OUT/$(basename "${*: -1}" .json).log" 2>&1; }
small="--dtype fp32 --dtype bf16 --backward --call-cost-ms ${CALL_MS:-200} --rep-ms 20"
calls() {  # $1: the launcher (fuselab, or triton: Triton's own launch)
  launcher=$1
  suffix=$([ "$launcher" = triton ] && echo _triton)
  FUSELAB_LAUNCHER=$launcher bench gelu --impl torch,triton,cuda --opt approximate=tanh --shape 4096 $small \
    --out "$OUT/call_cost_gelu$suffix.json"
  FUSELAB_LAUNCHER=$launcher bench softmax --impl torch,triton,cuda --shape 64x1000 $small \
    --out "$OUT/call_cost_softmax$suffix.json"
  FUSELAB_LAUNCHER=$launcher bench attention --impl sdpa,sdpa-cudnn,triton --shape 1x2x4x64 --shape 1x16x512x64 \
    --shape 2x16x4096x64 --dtype bf16 --dtype fp32 --opt causal=true --backward --call-cost-ms "${CALL_MS:-200}" \
    --rep-ms 20 --out "$OUT/call_cost_attention$suffix.json"
}
calls fuselab
sizes="--dtype fp32 --dtype bf16 --call-cost-ms 50 --rep-ms 20"
bench gelu --impl torch,triton,cuda --opt approximate=tanh --shape 1000 --shape 7919 --shape 50257 --shape 300007 \
  --shape 1234567 --shape 4000037 $sizes --plot-calls "$OUT/call_cost_gelu_sizes.png" --out "$OUT/call_cost_gelu_sizes.json"
bench softmax --impl torch,triton,cuda --shape 3x1000 --shape 37x325 --shape 1x11008 --shape 129x5003 \
  --shape 61x50257 --shape 4096x771 $sizes --plot-calls "$OUT/call_cost_softmax_sizes.png" \
  --out "$OUT/call_cost_softmax_sizes.json"
[ "${TRITON_LAUNCH:-1}" = 1 ] && calls triton  # last: a comparison, cut first (TRITON_LAUNCH=0 skips it)
ls "$OUT"
