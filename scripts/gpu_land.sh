#!/usr/bin/env bash
# One device call before a landing: the GPU gate on this tree, then the GPU report resumed in the time left.
#   FUSELAB_REVISION=<commit> CALL_S=570 REPORT=/tmp/report bash scripts/gpu_land.sh
# To $OUT: gate.json, gate_stdout.log, gatelogs.tgz (the gate's job logs), report.log and report.tgz (REPORT, without
# lock files, traces and ncu reports: REPORT_TGZ=path (a carried copy of the last call's report.tgz) unpacks it into
# REPORT first, so the report resumes; done sections are kept). A second call with SKIP_GATE=1 gives all of CALL_S to
# the report. Built CUDA extensions are kept in $OUT/ext.tgz for the next call (EXT_TGZ=path, carried, unpacks one
# first: scripts/ext_cache.sh, which keeps its builds where this tree's C and CUDA sources are the ones they were built
# from).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-/tmp/out}
REPORT=${REPORT:-/tmp/report}
export FUSELAB_EXT_DIR=${FUSELAB_EXT_DIR:-/tmp/fuselab-ext}
mkdir -p "$OUT" "$REPORT"
[ -n "${EXT_TGZ:-}" ] && bash scripts/ext_cache.sh unpack "$EXT_TGZ"
if [ -n "${REPORT_TGZ:-}" ] && [ -f "$REPORT_TGZ" ]; then  # the archive holds one folder, REPORT's name of its call
  tmp=$(mktemp -d) && tar xzf "$REPORT_TGZ" -C "$tmp" && cp -r "$tmp"/*/. "$REPORT"/ && rm -rf "$tmp"
fi
if [ "${SKIP_GATE:-0}" != 1 ]; then
  # 6 pytest workers: the GPU suite's Triton compiles are CPU-bound, and on 4 they outgrew 440 s (2026-12-02)
  # 500 s for the gate after its extension builds (about 1-2 min cold; docs/gate.md): one 600 s call holds both
  GATE_S=${GATE_S:-500} OUT="$OUT/gate" bash scripts/gpu_gate.sh --pytest-budget-s "${PYTEST_S:-470}" \
    --job-s "${JOB_S:-380}" --pytest-workers "${PYTEST_WORKERS:-6}" > "$OUT/gate_stdout.log" 2>&1
  echo "gate_rc=$?"
  cp "$(ls -t benchmarks/results/*/gate.json | head -1)" "$OUT/" 2>/dev/null  # the one this gate wrote (newest)
  tar czf "$OUT/gatelogs.tgz" -C "$OUT" gate && rm -rf "$OUT/gate"
  grep -E "^gate |^fuselab gate|^FAIL" "$OUT/gate_stdout.log" | cut -c1-400
fi
bash scripts/ext_cache.sh pack "$OUT/ext.tgz"
LEFT=$(( ${CALL_S:-570} - $(date +%s) + T0 ))
echo "report: ${LEFT} s left"
if [ "$LEFT" -gt 30 ]; then
  PYTHONPATH=src timeout "$LEFT" python3 -m fuselab report --out "$REPORT" > "$OUT/report.log" 2>&1
  echo "report_rc=$?"
fi
rm -f "$REPORT"/*.lock "$REPORT"/results/*.lock
# without the profiler traces and ncu's report (100+ MB: over what a device call brings back; the section files hold
# their figures)
tar czf "$OUT/report.tgz" --exclude="$(basename "$REPORT")/traces" --exclude='*.ncu-rep' \
  -C "$(dirname "$REPORT")" "$(basename "$REPORT")"
