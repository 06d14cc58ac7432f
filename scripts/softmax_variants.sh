#!/usr/bin/env bash
# The softmax's plan-table rules tried side by side on a GPU: for each VARIANTS entry "name:{json overrides}", the
# tree's table with those overrides of its parameters is written in place (a dict value is merged into the table's,
# or into the defaults' where the table has none: {"cuda_spans": {"staged_row_bytes_fp32": 0}} changes that one rule
# of the CUDA impl's) and `fuselab bench softmax` runs IMPLS at SHAPES (forward and forward + backward, CUDA-graph
# replays), comparing itself with the first variant (`--compare`: the cases past 5% slower are printed). The tree's
# table is put back whatever happens; everything goes into one file, $OUT/variants.tgz (the device machine sends back
# at most 8 files), and a table of the median µs of impl MEASURED (default cuda) per variant to stdout and, as
# benchmarks/results/*/explorations/ keep them, to variants.json in the archive. LIGER: an unzipped Liger-Kernel wheel
# (impl liger).
#   FUSELAB_REVISION=<commit> SHAPES="1553741x12 48449x577" MEASURED=triton IMPLS=torch,compile,triton \
#   VARIANTS='off:{} fill3:{"fill_warps_per_sm":3}' OUT=$OUT bash scripts/softmax_variants.sh
set -u
: "${SHAPES:?shapes, e.g. 1553741x12 48449x577}" "${VARIANTS:?name:{overrides} ..., the first the baseline}"
OUT=${OUT:-/tmp/softmax_variants}; DTYPES=${DTYPES:-fp32 bf16 fp16}
IMPLS=${IMPLS:-torch,cuda}; T_BENCH=${T_BENCH:-120}
export MEASURED=${MEASURED:-cuda}
export PYTHONPATH="src${LIGER:+:$LIGER}"
TABLE=${TABLE:-src/fuselab/ops/softmax/plans/$(python3 -c "from fuselab.ops import tuning; print(tuning.device_key(0))").json}
WORK=$(mktemp -d); mkdir -p "$OUT"; cp "$TABLE" "$WORK/tree.json"
trap 'cp "$WORK/tree.json" "$TABLE"' EXIT
args=(); for s in $SHAPES; do args+=(--shape "$s"); done
for d in $DTYPES; do args+=(--dtype "$d"); done
first=
for variant in $VARIANTS; do
  name=${variant%%:*}; overrides=${variant#*:}
  python3 - "$WORK/tree.json" "$TABLE" "$overrides" <<'PY' || exit 1
import json, sys
from fuselab.ops.softmax.plans import DEFAULTS
table = json.load(open(sys.argv[1]))
params = table["params"]
for key, value in json.loads(sys.argv[3]).items():  # a dict over the table's, itself over the defaults
    params[key] = {**DEFAULTS.get(key, {}), **params.get(key, {}), **value} if isinstance(value, dict) else value
json.dump(table, open(sys.argv[2], "w"), indent=2, sort_keys=True)
PY
  extra=(); [ -n "$first" ] && extra=(--compare "$WORK/$first.json")
  timeout "$T_BENCH" python3 -m fuselab bench softmax "${args[@]}" --impl "$IMPLS" --cuda-graph --backward \
    --rep-ms "${REP_MS:-5}" --warmup-ms 2 --rounds "${ROUNDS:-1}" --call-cost-ms 0 "${extra[@]}" \
    --out "$WORK/$name.json" > "$WORK/$name.log" 2>&1
  echo "$name rc=$? (1 when a case regressed against $first)"
  grep -E "regressed" "$WORK/$name.log"
  first=${first:-$name}
done
python3 - "$WORK" $VARIANTS <<'PY'
"""Impl MEASURED's median µs per (dtype, shape, pass) and variant, torch's (of the first variant's run) beside: a
table to stdout, and variants.json (the variants' overrides, the environment, the rows) as explorations/ keep them."""
import json, os, sys
work, variants = sys.argv[1], {n: json.loads(o) for n, o in (v.split(":", 1) for v in sys.argv[2:])}
names, times, env = list(variants), {}, None
for name in names:
    try:
        result = json.load(open(f"{work}/{name}.json"))
        records = result["records"]
    except (OSError, ValueError):
        continue
    env = env or {k: result["meta"]["env"].get(k) for k in ("gpu", "torch", "triton", "cuda", "driver", "revision")}
    for r in records:
        if r["status"] == "ok" and r["impl"] in (os.environ["MEASURED"], "torch"):
            key = (r["dtype"], "x".join(map(str, r["shape"])), r["pass"])
            times.setdefault(key, {}).setdefault(r["impl"] if r["impl"] == "torch" else name, r["median_ms"] * 1e3)
print("dtype shape pass torch " + " ".join(names))
for (dtype, shape, pass_), t in sorted(times.items()):
    print(dtype, shape, pass_, *(f"{t[n]:.1f}" if n in t else "-" for n in ["torch", *names]))
rows = [{"dtype": d, "shape": s, "pass": p, **{n: round(v, 2) for n, v in t.items()}}
        for (d, s, p), t in sorted(times.items())]
summary = {"measured": os.environ["MEASURED"], "variants": variants, "env": env, "rows": rows}
json.dump(summary, open(f"{work}/variants.json", "w"), indent=1)
PY
tar czf "$OUT/variants.tgz" -C "$WORK" .
