"""Compare one sweep run on 1 GPU and on N GPUs (`fuselab bench ... --out X.json`, then `--gpus N`): wall times and
the speed-up, every case present once in each log, rows per rank, and whether the same impl wins each case.

    python benchmarks/multi_gpu_summary.py --one r/sweep_1gpu.json --many r/sweep_2gpu.json \
        --walls 1gpu=83.1,1gpu_resume=9.0,2gpu=47.2,2gpu_resume=14.0 --out r/sweep_summary.json

Walls (seconds) come from the script that ran the commands; a `_resume` wall is the same command run again once the
log is complete (start-up, ceilings, table: the fixed cost), so wall - resume is the sweep's own time.
A winner is the impl with the lowest median per case (dtype, shape, options); a case whose best two impls are within
`--close` (relative) is a close call, reported apart: a tie is not a disagreement.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def load_log(path: Path) -> list[dict]:
    """The rows of X.json's resumable log X.jsonl (every row written, retries included)."""
    log = path.with_suffix(".jsonl")
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def case_of(row: dict) -> str:
    """The case a row measured (its sweep key: op, impl, dtype, shape, options)."""
    return row["key"]


def peers_of(row: dict) -> str:
    """The case without its impl: the rows that compete for a winner."""
    return json.dumps({k: v for k, v in json.loads(row["key"]).items() if k != "impl"}, sort_keys=True)


def winners(rows: list[dict], close: float) -> dict[str, dict]:
    """Per case (without the impl): the fastest impl, the runner-up's margin, and whether it is a close call."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("error") is None and row.get("median_ms"):
            groups.setdefault(peers_of(row), []).append(row)
    out = {}
    for key, members in groups.items():
        ranked = sorted(members, key=lambda r: r["median_ms"])
        margin = ranked[1]["median_ms"] / ranked[0]["median_ms"] - 1 if len(ranked) > 1 else None
        out[key] = {"winner": ranked[0]["impl"], "margin": margin, "close": margin is not None and margin < close}
    return out


def summarize(one: list[dict], many: list[dict], walls: dict[str, float], close: float) -> dict:
    counts = {name: Counter(case_of(r) for r in rows) for name, rows in (("one", one), ("many", many))}
    same_cases = set(counts["one"]) == set(counts["many"])
    once = all(c == 1 for name in counts for c in counts[name].values())
    w1, wn = winners(one, close), winners(many, close)
    agree = [k for k in w1 if k in wn and w1[k]["winner"] == wn[k]["winner"]]
    differ = [
        {"case": json.loads(k), "one": w1[k], "many": wn[k]}
        for k in w1
        if k in wn and w1[k]["winner"] != wn[k]["winner"]
    ]
    real = [d for d in differ if not (d["one"]["close"] or d["many"]["close"])]
    summary: dict[str, object] = {
        "cases": len(counts["one"]),
        "every_case_once": once and same_cases,
        "errors": {"one": sum(bool(r.get("error")) for r in one), "many": sum(bool(r.get("error")) for r in many)},
        "rows_per_rank": dict(Counter(str(r.get("rank", "-")) for r in many)),
        "hosts_gpus": sorted({f"{r.get('host')}:{r.get('gpu_index')}" for r in many}),
        "winners_agree": len(agree),
        "winners_differ_close": len(differ) - len(real),
        "winners_differ": real,
        "walls_s": walls,
        "close": close,
    }
    if "1gpu" in walls and "2gpu" in walls:
        summary["speedup_wall"] = walls["1gpu"] / walls["2gpu"]
        if "1gpu_resume" in walls and "2gpu_resume" in walls:
            sweep1 = walls["1gpu"] - walls["1gpu_resume"]
            sweep2 = walls["2gpu"] - walls["2gpu_resume"]
            summary["sweep_s"] = {"1gpu": sweep1, "2gpu": sweep2}
            summary["speedup_sweep"] = sweep1 / sweep2 if sweep2 > 0 else None
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one", type=Path, required=True, help="X.json of the 1-GPU run (its log X.jsonl is read)")
    p.add_argument("--many", type=Path, required=True, help="X.json of the N-GPU run")
    p.add_argument("--walls", default="", help="name=seconds,... (1gpu, 1gpu_resume, 2gpu, 2gpu_resume)")
    p.add_argument("--close", type=float, default=0.02, help="runner-up within this fraction: a close call")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    walls = {k: float(v) for k, v in (item.split("=") for item in args.walls.split(",") if item)}
    summary = summarize(load_log(args.one), load_log(args.many), walls, args.close)
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if summary["every_case_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
