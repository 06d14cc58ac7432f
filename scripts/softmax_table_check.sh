#!/usr/bin/env bash
# A softmax plan table checked on shapes it was not tuned on (issue 27; docs/ops/softmax.md): for each dtype, the
# SHAPES whose launches (forward, or backward) differ between the table before (BEFORE: a plans JSON file) and the
# tree's table are benched with each table in turn, torch beside (and Liger-Kernel's softmax with the tree's table,
# where LIGER names its unzipped wheel), forward and forward + backward, CUDA-graph replays; the second run compares
# itself with the first (`--compare`), and the cases past 5% slower are printed. Everything it writes goes
# into one file, $OUT/table_check.tgz (the device machine sends back at most 8 files). Give each bench time: on a
# machine just started one took over 40 s (compiles, ceilings). BEFORE in the tree's table format (`git show
# <rev>:src/fuselab/ops/softmax/plans/<key>.json`, into a folder `carry` takes along). Made of the two hand-run
# checks of 2026-12-03 (benchmarks/results/h200/explorations/softmax_table_check_seed2033.json); run on the H200
# twice since (softmax_table_check_seed2034.json: 39 and 45 shapes, 3 dtypes, about 185 s a call with Liger).
#   FUSELAB_REVISION=<commit> BEFORE=old.json SHAPES="577x2574 104x36799" OUT=$OUT bash scripts/softmax_table_check.sh
set -u
: "${BEFORE:?a plans JSON file: the table before}" "${SHAPES:?shapes, e.g. 577x2574 104x36799}"
OUT=${OUT:-/tmp/table_check}; DTYPES=${DTYPES:-fp32 bf16 fp16}; T_BENCH=${T_BENCH:-120}
export PYTHONPATH="src${LIGER:+:$LIGER}"
TABLE=src/fuselab/ops/softmax/plans/$(python3 -c "from fuselab.ops import tuning; print(tuning.device_key(0))").json
WORK=$(mktemp -d); mkdir -p "$OUT"; cp "$TABLE" "$WORK/after.json"; cp "$BEFORE" "$WORK/before.json"
trap 'cp "$WORK/after.json" "$TABLE"' EXIT  # the tree's table back, whatever happens
python3 - "$WORK" "$DTYPES" "$SHAPES" > "$WORK/changed.txt" 2> "$WORK/changed.log" <<'PY'
"""Per dtype, the shapes whose forward or backward launch differs between before.json and after.json."""
import json, sys, torch
from dataclasses import replace
from fuselab.bench.dtypes import parse_dtype
from fuselab.ops.softmax import launch, plans, tune
work, dtypes, shapes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rules = {n: {**plans.DEFAULTS, **json.load(open(f"{work}/{n}.json"))["params"]} for n in ("before", "after")}
sms = launch.sm_count(0)
def launches(p, x):
    y = torch.empty_like(x)
    forward = tune.launched_plan(x, y, p, sms)
    backward = plans.choose_backward(x.shape[1], x.element_size(), p, forward.reads)
    if backward.kernel == "rows":
        backward = replace(backward, rows=plans.fill_rows(backward.rows, backward.num_warps, x.shape[0], sms, p))
    return forward, backward
for name in dtypes:
    changed = []
    for shape in shapes:
        x = torch.empty(*map(int, shape.split("x")), dtype=parse_dtype(name), device="cuda")
        before, after = launches(rules["before"], x), launches(rules["after"], x)
        if before != after:
            changed.append(shape)
            print(name, shape, "before", *before, "after", *after, file=sys.stderr)
    print(name, " ".join(changed))
PY
echo "changed rc=$?"; cat "$WORK/changed.txt"
COMMON=(--cuda-graph --backward --rep-ms "${REP_MS:-5}" --warmup-ms 2 --rounds "${ROUNDS:-2}" --call-cost-ms 0)
while read -r dtype shapes; do
  [ -z "$shapes" ] && continue
  args=(); for s in $shapes; do args+=(--shape "$s"); done
  for which in before after; do  # after against before: `fuselab bench --compare`, case by case (torch: the noise)
    cp "$WORK/$which.json" "$TABLE"
    extra=(--impl torch,triton)
    [ "$which" = after ] && extra=(--impl "torch,triton${LIGER:+,liger}" --compare "$WORK/before_$dtype.json")
    timeout "$T_BENCH" python3 -m fuselab bench softmax "${args[@]}" --dtype "$dtype" "${extra[@]}" "${COMMON[@]}" \
      --out "$WORK/${which}_$dtype.json" > "$WORK/${which}_$dtype.log" 2>&1
    echo "$which $dtype rc=$? (after: 1 when a case regressed)"
  done
  grep -E "regressed" "$WORK/after_$dtype.log"
done < "$WORK/changed.txt"
tar czf "$OUT/table_check.tgz" -C "$WORK" .
