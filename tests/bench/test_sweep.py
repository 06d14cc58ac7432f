import json

import pytest

from fuselab.bench.sweep import grid, load_records, run_sweep


def test_grid_is_the_cartesian_product():
    cases = grid(impl=["a", "b"], n=[1, 2, 3])
    assert len(cases) == 6
    assert {"impl": "b", "n": 3} in cases


def test_each_case_is_appended_as_it_finishes_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "r.jsonl"
    cases = grid(n=[1, 2, 3, 4])
    calls = []

    def interrupted(case):
        if case["n"] == 3:
            raise KeyboardInterrupt
        calls.append(case["n"])
        return {"double": 2 * case["n"]}

    with pytest.raises(KeyboardInterrupt):
        run_sweep(cases, interrupted, out, show_progress=False)
    assert [r["n"] for r in load_records(out)] == [1, 2]

    def counting(case):
        calls.append(case["n"])
        return {"double": 2 * case["n"]}

    rows = run_sweep(cases, counting, out, show_progress=False)
    assert calls == [1, 2, 3, 4]  # 1 and 2 were not run again
    assert [r["double"] for r in rows] == [2, 4, 6, 8]
    assert len(load_records(out)) == 4


def test_a_failing_case_becomes_an_error_row_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "r.jsonl"

    def flaky(case):
        if case["n"] == 2:
            raise RuntimeError("compile error in case 2")
        return {"ok": True}

    rows = run_sweep(grid(n=[1, 2, 3]), flaky, out, show_progress=False)
    assert [r["error"] is None for r in rows] == [True, False, True]
    assert "compile error in case 2" in rows[1]["error"]

    rows = run_sweep(grid(n=[1, 2, 3]), lambda case: {"ok": True}, out, show_progress=False)
    assert all(r["error"] is None for r in rows)  # failed cases are retried on a rerun, done ones kept


def test_a_torn_last_line_is_ignored(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"n": 1, "key": "x", "error": None}) + "\n" + '{"n": 2, "ke')
    assert len(load_records(out)) == 1


def test_a_damaged_middle_line_is_reported_and_its_case_runs_again(tmp_path):
    import warnings

    from fuselab.bench.log import SweepWarning

    out = tmp_path / "r.jsonl"
    run_sweep(grid(n=[1, 2, 3]), lambda case: {"ok": True}, out, show_progress=False)
    lines = out.read_text().splitlines()
    out.write_text("\n".join([lines[0], lines[1][:-5], lines[2]]) + "\n")  # the middle row damaged
    with pytest.warns(SweepWarning, match=r"r\.jsonl:2: not a JSON row"):
        assert len(load_records(out)) == 2
    ran = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SweepWarning)
        run_sweep(grid(n=[1, 2, 3]), lambda case: ran.append(case["n"]) or {"ok": True}, out, show_progress=False)
    assert ran == [2]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn last line stays quiet here (repair_log warns when it cuts one)
        out.write_text(lines[0] + "\n" + lines[1][:-5])
        assert len(load_records(out)) == 1


def test_progress_lines_without_a_terminal_show_an_eta_weighed_by_the_cases_cost(monkeypatch):
    """The remaining cases' cost over the done ones' (`cost`, estimated seconds), times the time taken so far; the last
    line has none."""
    import re
    import time

    from fuselab.bench import sweep

    monkeypatch.setattr(sweep, "PROGRESS_EVERY_S", 0.0)
    lines: list[str] = []
    cost = {1: 1, 2: 1, 3: 2}.__getitem__  # case n's estimated seconds

    def run(case):
        time.sleep(0.2 * cost(case["n"]))
        return {}

    run_sweep(grid(n=[1, 2, 3]), run, None, description="toy", log=lines.append, cost=lambda case: cost(case["n"]))
    etas = [re.search(r"eta ([\d.]+) s", line) for line in lines]
    assert etas[-1] is None and None not in etas[:-1], lines
    first, second = (float(m.group(1)) for m in etas[:-1])
    assert 0.45 <= first <= 1.2  # 0.2 s for a cost of 1, 3 to go: about 0.6 s
    assert 0.25 <= second <= 0.8  # 0.4 s for 2, 2 to go: about 0.4 s


def test_the_eta_counts_a_begun_group_as_done(monkeypatch):
    """bench runs a case's impls together at the first one's row: after that row, the whole group's cost is spent."""
    import re
    import time

    from fuselab.bench import sweep

    monkeypatch.setattr(sweep, "PROGRESS_EVERY_S", 0.0)
    lines: list[str] = []

    def run(case):
        time.sleep(0.3 if case["impl"] == "a" else 0.0)  # the group's work, done at its first impl
        return {}

    cases = grid(n=[1, 2], impl=["a", "b"])
    run_sweep(cases, run, None, log=lines.append, group=lambda case: str(case["n"]))
    first = float(re.search(r"eta ([\d.]+) s", lines[0]).group(1))
    assert 0.2 <= first <= 0.6  # one group of two to go: about 0.3 s, not 3 x 0.3
