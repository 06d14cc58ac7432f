"""Maps of an op's impls over a random draw, and two maps compared shape by shape.

A map (benchmarks/results/*/explorations/*_map_*.json) keeps, of a `fuselab bench OP --shapes random:N` run, each
case's median µs per impl (a status string where it did not run), in rows of (dtype, case, pass), a case being its
shape with its options and a layout other than contiguous: small enough to commit where the run's own JSON is not.
`compare` puts a new run (its JSON, or its map) beside an old map: per impl, dtype and pass, how many cases got
faster or slower past the threshold (and by at least `--min-us`: a machine's drift at the smallest cases, 0.2-0.4 µs
for every impl on 2026-12-05, is not a change of the code) and which, and each impl's time over torch's and over the
rival's (95th percentile, as `fuselab bench --shapes` gives it, and worst) before and after.

    python scripts/impl_map.py reduce RUN.json --out MAP.json --what "A map of ..."
    python scripts/impl_map.py compare benchmarks/results/h200/explorations/softmax_map_seed2041.json RUN.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fuselab.bench.record import CONTIGUOUS, Row

Key = tuple[str, str, str]  # (dtype, case "AxB[ option=value ...]", pass)


def case_label(record: dict) -> str:
    """A case's shape "AxB", then its option values and a layout other than contiguous, read from the record's key
    (`Row.from_json`): "999 approximate=tanh", "164x32000 layout=transposed" (so that cases differing in them stay
    apart). A record without a key is its shape alone."""
    shape = "x".join(map(str, record["shape"]))
    if "key" not in record:
        return shape
    case = Row.from_json(record).case
    layout = [] if case.layout == CONTIGUOUS else [f"layout={case.layout}"]
    return " ".join([shape, *(f"{name}={value}" for name, value in case.options), *layout])


def reduce(run: dict) -> list[dict]:
    """The rows of a map from a `fuselab bench --out` JSON: one per (dtype, case, pass), each impl's median µs
    (rounded to 0.01) or its status; a row's "shape" is its `case_label`."""
    rows: dict[Key, dict] = {}
    for r in run["records"]:
        key = (r["dtype"], case_label(r), r["pass"])
        row = rows.setdefault(key, {"dtype": key[0], "shape": key[1], "pass": key[2]})
        row[r["impl"]] = round(r["median_ms"] * 1e3, 2) if r["status"] == "ok" else r["status"]
    return list(rows.values())


def load(path: Path) -> tuple[list[dict], dict]:
    """(rows, env) of a map or of a bench run's JSON."""
    data = json.loads(path.read_text())
    if "records" in data:
        env = data["meta"]["env"]
        return reduce(data), {k: env.get(k) for k in ("gpu", "torch", "triton", "cuda", "driver", "revision")}
    return data["rows"], data.get("env", {})


def impls(rows: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows:
        seen.update((k, None) for k in row if k not in ("dtype", "shape", "pass"))
    return list(seen)


def timed(row: dict, impl: str) -> float | None:
    value = row.get(impl)
    return float(value) if isinstance(value, (int, float)) else None


def ratios(rows: list[dict], impl: str, over: str) -> list[float]:
    return [a / b for r in rows if (a := timed(r, impl)) is not None and (b := timed(r, over)) is not None]


def compare(
    old: list[dict], new: list[dict], threshold: float, baseline: str, rival: str | None, top: int, min_us: float = 0.0
) -> str:
    """The report: per impl, dtype and pass, the cases past `threshold` (a fraction) and `min_us` faster or slower,
    and ratios."""
    before = {(r["dtype"], r["shape"], r["pass"]): r for r in old}
    lines = []
    shared = [r for r in new if (r["dtype"], r["shape"], r["pass"]) in before]
    lines.append(f"{len(shared)} of {len(new)} new cases are in the old map ({len(old)} cases)")
    groups = sorted({(r["dtype"], r["pass"]) for r in shared})
    for impl in impls(shared):
        for dtype, pas in groups:
            pairs = []
            for r in shared:
                if (r["dtype"], r["pass"]) != (dtype, pas):
                    continue
                a, b = timed(before[(dtype, r["shape"], pas)], impl), timed(r, impl)
                if a is not None and b is not None:
                    pairs.append((b / a, r["shape"], a, b))
            if not pairs:
                continue
            moved = [p for p in pairs if abs(p[3] - p[2]) >= min_us]
            slower = sorted((p for p in moved if p[0] > 1 + threshold), reverse=True)
            faster = sorted(p for p in moved if p[0] < 1 - threshold)
            line = f"{impl} {dtype} {pas}: {len(pairs)} cases, {len(faster)} faster, {len(slower)} slower"
            if impl != baseline:
                group_old = [
                    before[(dtype, r["shape"], pas)] for r in shared if (r["dtype"], r["pass"]) == (dtype, pas)
                ]
                group_new = [r for r in shared if (r["dtype"], r["pass"]) == (dtype, pas)]
                for over in filter(None, (baseline, rival if rival != impl else None)):
                    was, now = ratios(group_old, impl, over), ratios(group_new, impl, over)
                    if was and now:
                        line += (f"; /{over} p95 {np.percentile(was, 95):.3f} -> {np.percentile(now, 95):.3f}, worst"
                                 f" {max(was):.3f} -> {max(now):.3f}")  # fmt: skip
            lines.append(line)
            for tag, cases in (("slower", slower), ("faster", faster)):
                for change, shape, a, b in cases[:top]:
                    lines.append(f"    {tag} {shape}: {a:.2f} -> {b:.2f} us ({change:.2f}x)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    red = sub.add_parser("reduce", help="a bench run's JSON -> a map")
    red.add_argument("run", type=Path)
    red.add_argument("--out", type=Path, required=True)
    red.add_argument("--what", default="", help="what the map is (its 'what' field)")
    red.add_argument("--command", default="", help="the command that made the run (its 'command' field)")
    cmp_ = sub.add_parser("compare", help="an old map against a new run (its JSON or its map), shape by shape")
    cmp_.add_argument("old", type=Path)
    cmp_.add_argument("new", type=Path)
    cmp_.add_argument("--threshold", type=float, default=5.0, help="%% faster or slower that counts (default 5)")
    cmp_.add_argument("--baseline", default="torch", help="the impl ratios are taken over (default torch)")
    cmp_.add_argument("--rival", default="liger", help="a second impl to take ratios over (default liger)")
    cmp_.add_argument("--top", type=int, default=8, help="cases listed per side (default 8)")
    cmp_.add_argument("--min-us", type=float, default=0.5, help="µs faster or slower that counts too (default 0.5)")
    args = parser.parse_args()
    if args.action == "reduce":
        rows, env = load(args.run)
        args.out.write_text(json.dumps({"what": args.what, "command": args.command, "env": env, "rows": rows}) + "\n")
        print(f"{len(rows)} rows -> {args.out}")
        return
    (old, old_env), (new, new_env) = load(args.old), load(args.new)
    print(
        f"old: {old_env.get('revision')} ({old_env.get('gpu')}); new: {new_env.get('revision')} ({new_env.get('gpu')})"
    )
    print(compare(old, new, args.threshold / 100, args.baseline, args.rival, args.top, args.min_us))


if __name__ == "__main__":
    main()
