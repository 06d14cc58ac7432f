"""Sweeps spread over ranks: the split, the gather, the part files, resume after a killed rank, the lock, isolation.

Multi-rank tests run two CPU processes with the gloo backend on loopback (torch.multiprocessing), through the same
code path torchrun takes (fuselab.bench.distributed.session reads RANK/WORLD_SIZE/MASTER_* from the environment).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import socket
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from fuselab.bench import distributed
from fuselab.bench.distributed import LogBusy, LogLock, merge_parts, part_files, part_path, plan, split_by_cost
from fuselab.bench.sweep import grid, latest_by_key, load_records, run_sweep

WORLD = 2
pytestmark = pytest.mark.timeout(120)  # a hung collective fails the test instead of the CI job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, name: str, args: tuple) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    with distributed.session(timeout_s=60):
        globals()[name](*args)


def spawn(name: str, *args: object, world: int = WORLD) -> None:
    """Run the module-level function `name(*args)` on `world` gloo ranks; a rank that fails stops the rest, raising."""
    mp.start_processes(_rank_main, args=(world, free_port(), name, args), nprocs=world, start_method="spawn")


# ---------------------------------------------------------------------------------------------- the split


def test_lpt_split_balances_random_costs_and_is_deterministic():
    rng = random.Random(7)
    costs = [rng.uniform(0.1, 9.0) for _ in range(41)]
    parts = split_by_cost(costs, 3)
    assert sorted(i for p in parts for i in p) == list(range(41))  # every case once
    loads = [sum(costs[i] for i in p) for p in parts]
    assert max(loads) <= sum(costs) / 3 + max(costs)  # LPT's bound: within the largest job of even
    assert max(loads) - min(loads) < max(costs)
    assert split_by_cost(costs, 3) == parts
    assert split_by_cost(costs, 1) == [list(range(41))]
    with pytest.raises(ValueError, match="at least 1"):
        split_by_cost(costs, 0)


def test_plan_keeps_groups_together_and_spreads_compile_heavy_groups():
    cases = [{"impl": impl, "n": n} for n in range(6) for impl in ("eager", "compiled")]
    # a compiled case costs 10, an eager one 1; groups are the cases of one n
    cost = lambda c: 10.0 if (c["impl"] == "compiled" and c["n"] < 2) else 1.0  # noqa: E731
    parts = plan(cases, 2, cost=cost, group=lambda c: str(c["n"]))
    for part in parts:
        ns = [cases[i]["n"] for i in part]
        assert all(ns.count(n) == 2 for n in set(ns))  # both impls of an n on one rank
    heavy = [sum(cases[i]["n"] < 2 and cases[i]["impl"] == "compiled" for i in p) for p in parts]
    assert heavy == [1, 1]  # the two compile-heavy groups land on different ranks
    assert plan([], 2) == [[], []]


def test_pop_gpus_and_gpus_requested():
    assert distributed.pop_gpus(["bench", "gelu", "--gpus", "2", "--dtype", "fp32"]) == (
        ["bench", "gelu", "--dtype", "fp32"],
        "2",
    )
    assert distributed.pop_gpus(["--gpus=all", "check", "gelu"]) == (["check", "gelu"], "all")
    assert distributed.pop_gpus(["check", "gelu"]) == (["check", "gelu"], None)
    with pytest.raises(ValueError, match="--gpus takes"):
        distributed.pop_gpus(["check", "--gpus"])
    with pytest.raises(ValueError, match="count or 'all'"):
        distributed.gpus_requested("two")
    if distributed.torch.cuda.device_count() == 0:
        with pytest.raises(ValueError, match="torchrun --nproc-per-node 2"):
            distributed.gpus_requested("2")


# ---------------------------------------------------------------------------------------------- the log


def test_the_lock_stops_a_second_run_and_names_the_holder(tmp_path):
    log = tmp_path / "r.jsonl"
    with LogLock(log):
        with pytest.raises(LogBusy, match=f"pid {os.getpid()}"):
            LogLock(log).acquire()
        with pytest.raises(LogBusy, match=r"r\.jsonl is being written by another run"):
            run_sweep(grid(n=[1]), lambda c: {}, log, show_progress=False)
    assert run_sweep(grid(n=[1]), lambda c: {"ok": 1}, log, show_progress=False)[0]["ok"] == 1  # released


def test_merge_is_idempotent_and_a_single_rank_rerun_reads_part_files(tmp_path):
    log = tmp_path / "r.jsonl"
    cases = grid(n=[1, 2, 3, 4, 5])
    rows = [{"n": n, "key": json.dumps({"n": n}), "error": None, "v": n * n} for n in (1, 2)]
    part_path(log, 0).write_text(json.dumps(rows[0]) + "\n")
    part_path(log, 3).write_text(json.dumps(rows[1]) + "\n" + '{"n": 3, "ke')  # a rank killed mid-write
    assert [p.name for p in part_files(log)] == ["r.rank0.jsonl", "r.rank3.jsonl"]
    calls: list[int] = []

    def run(case):
        calls.append(case["n"])
        return {"v": case["n"] ** 2}

    out = run_sweep(cases, run, log, show_progress=False)
    assert calls == [3, 4, 5]  # the parts' finished cases were kept
    assert [r["v"] for r in out] == [1, 4, 9, 16, 25]
    assert part_files(log) == []
    part_path(log, 1).write_text(json.dumps(rows[0]) + "\n")  # a merge cut short, redone
    assert merge_parts(log) == 0
    assert len(load_records(log)) == 5


# ---------------------------------------------------------------------------------------------- two gloo ranks


def _sweep_rank(out: str, calls_dir: str, die_after: int) -> None:
    me = distributed.rank()
    calls = Path(calls_dir) / f"calls.{os.getpid()}"
    seen = []

    def run(case):
        if case["n"] % 7 == 3:
            raise RuntimeError(f"case {case['n']} fails")
        if me == 1 and die_after >= 0 and len(seen) >= die_after:
            os._exit(3)  # killed mid-sweep: its finished rows stay in its part file
        seen.append(case["n"])
        with calls.open("a") as f:
            f.write(f"{case['n']},{case['impl']}\n")
        time.sleep(0.01)
        return {"square": case["n"] ** 2, "pid": os.getpid()}

    cases = [{"n": n, "impl": impl} for n in range(12) for impl in ("a", "b")]
    rows = run_sweep(
        cases, run, Path(out), show_progress=False, cost=lambda c: 1.0 + c["n"] % 4, group=lambda c: str(c["n"])
    )
    Path(out).with_name(f"returned.{me}.json").write_text(json.dumps(rows))


def _calls(tmp_path: Path) -> list[tuple[int, str]]:
    """The (n, impl) cases run, from every process's calls file."""
    return [(int(x.split(",")[0]), x.split(",")[1]) for f in tmp_path.glob("calls.*") for x in f.read_text().split()]


def test_two_ranks_split_gather_and_merge_into_one_log(tmp_path):
    out = tmp_path / "r.jsonl"
    spawn("_sweep_rank", str(out), str(tmp_path), -1)
    a, b = (json.loads((tmp_path / f"returned.{k}.json").read_text()) for k in (0, 1))
    assert a == b  # every rank returns every row, in case order
    assert [(r["n"], r["impl"]) for r in a] == [(n, i) for n in range(12) for i in ("a", "b")]
    records = load_records(out)
    assert len(records) == 24 and len({r["key"] for r in records}) == 24  # every case once, in one log
    assert part_files(out) == []
    assert {r["rank"] for r in records} == {0, 1}
    assert all(r["host"] == socket.gethostname() and "gpu_index" in r for r in records)
    by_n = {}
    for r in records:
        by_n.setdefault(r["n"], set()).add(r["rank"])
    assert all(len(ranks) == 1 for ranks in by_n.values())  # a group stays on one rank
    assert sorted(_calls(tmp_path)) == [(n, i) for n in range(12) for i in "ab" if n % 7 != 3]  # each run once
    assert [r["error"] is not None for r in a].count(True) == 4  # n = 3 and 10, both impls: error rows


def test_a_killed_rank_leaves_its_rest_to_a_rerun_on_one_rank(tmp_path):
    out = tmp_path / "r.jsonl"
    with pytest.raises(mp.ProcessExitedException):
        spawn("_sweep_rank", str(out), str(tmp_path), 3)
    first = _calls(tmp_path)
    parts = part_files(out)
    assert parts, "the ranks' finished rows are in their part files"
    kept = {r["key"] for p in parts for r in load_records(p) if r.get("error") is None}
    assert len(kept) >= 3  # rank 1 finished three cases before it died
    for f in tmp_path.glob("calls.*"):
        f.unlink()

    _sweep_rank_single(out, tmp_path)  # the rerun, one rank, the same log
    again = _calls(tmp_path)
    assert not set(again) & {(json.loads(k)["n"], json.loads(k)["impl"]) for k in kept}  # finished: not redone
    assert sorted(set(again) | {(json.loads(k)["n"], json.loads(k)["impl"]) for k in kept}) == [
        (n, i) for n in range(12) for i in "ab" if n % 7 != 3
    ]
    latest = latest_by_key(load_records(out))
    assert len(latest) == 24 and sum(r["error"] is None for r in latest.values()) == 20
    assert part_files(out) == []
    assert len(first) >= 3


def _sweep_rank_single(out: Path, tmp_path: Path) -> None:
    calls = tmp_path / "calls.rerun"

    def run(case):
        if case["n"] % 7 == 3:
            raise RuntimeError(f"case {case['n']} fails")
        with calls.open("a") as f:
            f.write(f"{case['n']},{case['impl']}\n")
        return {"square": case["n"] ** 2}

    cases = [{"n": n, "impl": impl} for n in range(12) for impl in ("a", "b")]
    rows = run_sweep(cases, run, out, show_progress=False)
    assert [r["square"] for r in rows if not r["error"]] == [n * n for n in range(12) for _ in "ab" if n % 7 != 3]


def _locked_rank(out: str) -> None:
    try:
        run_sweep(grid(n=[1, 2]), lambda c: {}, Path(out), show_progress=False)
        message = "no error"
    except LogBusy as exc:
        message = str(exc)
    Path(out).with_name(f"error.{distributed.rank()}").write_text(message)


def test_a_locked_log_stops_every_rank_with_the_holders_pid(tmp_path):
    out = tmp_path / "r.jsonl"
    with LogLock(out):
        spawn("_locked_rank", str(out))
    for k in range(WORLD):
        assert f"pid {os.getpid()}" in (tmp_path / f"error.{k}").read_text()
    assert not out.exists()


def _isolated_rank(folder: str) -> None:
    distributed.set_isolate(True)
    spans = []
    for _ in range(3):
        time.sleep(0.01)  # "preparing" runs side by side
        with distributed.timed_region():
            start = time.perf_counter()
            time.sleep(0.05)
            spans.append((start, time.perf_counter()))
    distributed.set_isolate(False)
    Path(folder, f"spans.{distributed.rank()}").write_text(json.dumps(spans))


def test_isolate_lets_one_rank_time_at_a_time(tmp_path):
    spawn("_isolated_rank", str(tmp_path))
    spans = sorted(s for k in range(WORLD) for s in json.loads((tmp_path / f"spans.{k}").read_text()))
    assert len(spans) == 3 * WORLD
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # no two timed regions overlap


def _report_rank(out: str) -> None:
    from fuselab.report import run_full_report
    from fuselab.report.runner import Section

    def swept(ctx, doc):
        rows = run_sweep(
            grid(n=list(range(6))), lambda c: {"sq": c["n"] ** 2}, ctx.log("swept", "n"), show_progress=False
        )
        doc.text(f"{len(rows)} rows")
        return {"rows": len(rows), "ranks": sorted({r.get("rank") for r in rows})}

    def plain(ctx, doc):
        doc.text(f"plain on rank {distributed.rank()}")
        return {"rank": distributed.rank()}

    sections = [Section("swept", "A sweep", swept), Section("plain", "Plain", plain)]
    records = run_full_report(out, device="cpu", quick=True, sections=sections, show_progress=False)
    Path(out, f"returned.{distributed.rank()}.json").write_text(
        json.dumps({k: r["status"] for k, r in records.items()})
    )


def test_report_sections_run_on_every_rank_their_sweeps_spread_and_rank_0_writes(tmp_path):
    out = tmp_path / "report"
    spawn("_report_rank", str(out))
    assert json.loads((out / "returned.0.json").read_text()) == {"swept": "ok", "plain": "ok"}
    assert json.loads((out / "returned.1.json").read_text()) == {"swept": "ok", "plain": "ok"}
    record = json.loads((out / "results" / "swept.json").read_text())
    assert record["results"] == {"rows": 6, "ranks": [0, 1]}
    assert json.loads((out / "results" / "plain.json").read_text())["results"] == {"rank": 0}  # rank 0's record
    assert len(load_records(out / "results" / "swept.n.jsonl")) == 6
    assert "plain on rank 0" in (out / "report.md").read_text()
    assert sorted(p.name for p in (out / "results").iterdir()) == [
        "plain.json",
        "swept.json",
        "swept.n.jsonl",
    ]  # no lock file left behind
