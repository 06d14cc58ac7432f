#!/usr/bin/env bash
# One `fuselab bench` command timed on two versions of this tree, side by side in one device call: "before" (this
# tree's src/ with the patch files BEFORE applied in order) and "after" (with AFTER's). Each side is a copy in WORK
# (default /tmp/ab-trees, emptied first) with its own FUSELAB_EXT_DIR, and both sides' extensions are built first,
# all side by side (scripts/build_extensions.sh: 1-2 min on the H200's host; a build made at another path is of no
# use, since ninja rebuilds what was compiled from another path). Then the runs: before; after, with `--compare`
# against before (the cases past 5% slower are printed); with AGAIN=1, before once more: how far the machine drifts
# between two runs of the same code, below which a change is not the code's. Patches are `git format-patch` or
# `git diff` files; only their src/ parts are applied, with patch(1) (the device's tree has no .git).
#   OUT=$OUT FUSELAB_REVISION=<commit> BEFORE="pending/a/*.patch" AFTER="pending/a/*.patch pending/b/*.patch" \
#     bash scripts/ab_trees.sh softmax --shape 21250x1741 --dtype bf16 --impl torch,cuda --cuda-graph --backward \
#     --rep-ms 5 --warmup-ms 2 --rounds 1 --call-cost-ms 0
# Several bench commands, separated by `---`, share the builds (runs before-1, after-1, before-2, ...).
# To $OUT: ab.tgz (before.json, after.json, again.json, their logs, the builds' logs); to stdout, the slower cases
# and `scripts/impl_map.py compare` of before and after. T_RUN: each run's timeout (default 150 s). EXTRA_PATH: more
# PYTHONPATH (an unzipped Liger-Kernel wheel, for impl liger). BUILD=0: no builds first.
# CHECKS: `fuselab check` commands, separated by ';' (e.g. "attention --impl triton --opt causal=true; softmax --impl
# cuda"), run on the after tree once the benches are done (a bench measures only the forward's error; a check
# compares forward and gradients with float64): each as check-after-N.json, and where one fails, again on the before
# tree (check-before-N), so that a failure the patches brought is told from one they found. T_CHECK: each check's
# timeout (default 150 s).
set -uo pipefail
[ $# -ge 1 ] || [ -n "${CHECKS:-}" ] \
  || { echo "usage: [BEFORE=...] [AFTER=...] [CHECKS=...] $0 [OP [bench options] [--- OP [bench options] ...]]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/ab}; T_RUN=${T_RUN:-150}; REV=${FUSELAB_REVISION:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)}
WORK=${WORK:-/tmp/ab-trees}
if [ -e "$WORK" ] && [ ! -f "$WORK/.ab-trees" ]; then echo "WORK=$WORK exists and is not this script's" >&2; exit 2; fi
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK/logs" && touch "$WORK/.ab-trees"

src_part() {  # the diff blocks of patch file $1 that touch src/, on stdout
  "${PYTHON:-python3}" - "$1" <<'PY'
import re, sys
blocks = re.split(r"(?m)^(?=diff --git )", open(sys.argv[1], encoding="utf-8").read())
sys.stdout.write("".join(b for b in blocks if b.startswith("diff --git a/src/")))
PY
}

for side in before after; do
  mkdir -p "$WORK/$side" "$WORK/ext-$side"
  cp -r "$ROOT/src" "$WORK/$side/"
  patches=${BEFORE:-}; [ "$side" = after ] && patches=${AFTER:-}
  for f in $patches; do  # unquoted: the lists are globs
    [ -f "$f" ] || { echo "$side: no patch file $f" >&2; exit 2; }
    src_part "$f" > "$WORK/part.diff"
    [ -s "$WORK/part.diff" ] || continue  # touches nothing under src/
    (cd "$WORK/$side" && patch -p1 -s --no-backup-if-mismatch < "$WORK/part.diff") \
      || { echo "$side: $f does not apply" >&2; exit 2; }
  done
  echo "$side: $(echo $patches | wc -w) patch files applied"
  if [ "${BUILD:-1}" = 1 ]; then
    FUSELAB_EXT_DIR="$WORK/ext-$side" SRC="$WORK/$side/src" bash "$ROOT/scripts/build_extensions.sh" \
      "$WORK/logs/build-$side" > "$WORK/logs/build-$side.txt" 2>&1 &
  fi
done
wait
cat "$WORK"/logs/build-*.txt 2>/dev/null

fuselab_on() {  # fuselab_on SIDE NAME SECONDS ARGS...: `fuselab ARGS` on the tree SIDE into $WORK/NAME.json; its rc
  local side=$1 name=$2 seconds=$3; shift 3
  (cd "$WORK/$side" && FUSELAB_EXT_DIR="$WORK/ext-$side" FUSELAB_REVISION="$REV+$side" \
    PYTHONPATH="src${EXTRA_PATH:+:$EXTRA_PATH}" timeout "$seconds" "${PYTHON:-python3}" -m fuselab "$@" \
    --out "$WORK/$name.json" > "$WORK/logs/$name.log" 2>&1)
}

archive() {  # everything so far into $OUT/ab.tgz: what ran comes back if a later run fails
  (cd "$WORK" && tar czf "$OUT/ab.tgz" ./*.json logs)
}

bench() {  # bench SIDE NAME [extra options]: a run of the tree SIDE into $WORK/NAME.json
  local side=$1 name=$2; shift 2
  fuselab_on "$side" "$name" "$T_RUN" bench "${ARGS[@]}" "$@"
  local rc=$?
  echo "$name: rc $rc$([ $rc = 1 ] && echo ' (cases slower than before, below)')"
  grep -E "regressed|slower" "$WORK/logs/$name.log" | head -40
}

commands=(); current=()  # the bench commands, separated by ---
for arg in "$@" ---; do
  if [ "$arg" != --- ]; then current+=("$arg"); continue; fi
  [ ${#current[@]} -gt 0 ] && commands+=("${current[*]@Q}")
  current=()
done
n=0
for command in "${commands[@]}"; do
  n=$((n + 1)); eval "ARGS=($command)"
  tag=$([ ${#commands[@]} -gt 1 ] && echo "-$n")
  echo "== command $n: fuselab bench ${ARGS[*]}"
  bench before "before$tag"
  bench after "after$tag" --compare "$WORK/before$tag.json"
  [ "${AGAIN:-0}" = 1 ] && bench before "again$tag" --compare "$WORK/before$tag.json"
  [ -f "$WORK/before$tag.json" ] && [ -f "$WORK/after$tag.json" ] \
    && PYTHONPATH="$ROOT/src" "${PYTHON:-python3}" "$ROOT/scripts/impl_map.py" compare "$WORK/before$tag.json" "$WORK/after$tag.json"
  archive
done

n=0
checks_line=${CHECKS:-}; IFS=';' read -ra checks <<< "${checks_line//$'\n'/ }"  # may span lines
for command in "${checks[@]}"; do
  [ -n "${command// }" ] || continue
  n=$((n + 1)); read -ra ARGS <<< "$command"
  fuselab_on after "check-after-$n" "${T_CHECK:-150}" check "${ARGS[@]}"; rc=$?
  echo "== check $n: fuselab check ${ARGS[*]}: after rc $rc"
  if [ $rc != 0 ]; then
    grep -E "fail|Error|error" "$WORK/logs/check-after-$n.log" | head -20
    fuselab_on before "check-before-$n" "${T_CHECK:-150}" check "${ARGS[@]}"
    echo "   before rc $? (0: the failure is the patches')"
  fi
  archive
done
