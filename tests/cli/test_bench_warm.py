"""`fuselab bench --warm-jobs K`: the compiled cases compiled first in K workers, then the same run as without."""

from __future__ import annotations

import json

import pytest

from fuselab.bench import distributed
from fuselab.cli import main

DRAW = ["gelu", "--shapes", "random:2", "--impl", "torch,naive,compile", "--dtype", "fp32", "--opt", "approximate=tanh"]
FAST = ["--device", "cpu", "--rep-ms", "2", "--warmup-ms", "1", "--rounds", "1", "--call-cost-ms", "0"]


def _results(path) -> tuple[dict, dict[str, tuple[str, str | None]]]:
    body = json.loads(path.read_text())
    return body["meta"], {r["key"]: (r["status"], r["error"]) for r in body["records"]}


@pytest.mark.slow  # two runs of two torch.compile cases each: about 25 s on a 2-core CPU with a warm Inductor cache
def test_warm_jobs_compiles_in_workers_then_times_the_same_cases_as_without(fuselab, tmp_path, monkeypatch, cache):
    """A draw of two gelu shapes with torch.compile among the impls: with --warm-jobs 2 (`python -m fuselab`, as a
    user runs it) each worker warms one compiled case (a line each), the timed run reads every graph from the cache,
    and the rows are the cases of the run without it (here in-process), all ok; the results' meta says how many jobs
    and seconds the warm-up took."""
    warm = fuselab("bench", *DRAW, *FAST, "--warm-jobs", "2", "--out", str(tmp_path / "warm.json"))
    assert warm.returncode == 0, warm.stderr[-3000:]
    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    assert main(["bench", *DRAW, *FAST, "--out", str(tmp_path / "cold.json")]) == 0
    meta, rows = _results(tmp_path / "warm.json")
    cold_meta, cold_rows = _results(tmp_path / "cold.json")
    assert rows.keys() == cold_rows.keys() and len(rows) == 6  # 3 impls x 2 shapes
    assert set(rows.values()) == set(cold_rows.values()) == {("ok", None)}
    assert "warm" not in cold_meta
    done = meta["warm"]
    assert (done["jobs"], done["workers"], done["cases"], done["warmed"], done["failed"]) == (2, 2, 2, 2, 0)
    assert done["seconds"] > 0 and done["cache_dir"]
    assert done["timed_run_cache"]["miss"] == 0 and done["timed_run_cache"]["hit"] >= 2
    for k in (1, 2):
        assert f"warm-up: worker {k}/2 done in " in warm.stderr and ": 1 of 1 cases warmed" in warm.stderr
    out = " ".join(warm.stdout.split())
    assert "warm-up: 2 of 2 cases warmed by 2 workers in " in out
    assert f"the timed run's compiles: {done['timed_run_cache']['hit']} graphs read from the cache, 0 compiled" in out


def test_warm_jobs_without_a_compiled_impl_starts_no_worker_and_records_it(tmp_path, monkeypatch, capsys, cache):
    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    args = ["bench", "gelu", "--impl", "torch,naive", "--shape", "1000", "--dtype", "fp32", *FAST]
    assert main([*args, "--warm-jobs", "3", "--out", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr()
    assert "warm-up: no case to warm" in out.out and "worker" not in out.err
    meta, rows = _results(tmp_path / "r.json")
    assert meta["warm"]["jobs"] == 3 and meta["warm"]["workers"] == 0 and len(rows) == 4  # 2 impls x 2 forms


def test_warm_jobs_is_refused_under_torchrun_in_one_line(tmp_path, monkeypatch, capsys, cache):
    """Ranks of torchrun (here: the group's test, `distributed.active`, said true) refuse --warm-jobs before timing."""
    monkeypatch.setenv("FUSELAB_CACHE", str(cache))
    monkeypatch.setattr(distributed, "active", lambda: True)
    args = ["bench", "gelu", "--impl", "compile", "--shape", "1000", "--dtype", "fp32", *FAST, "--warm-jobs", "2"]
    assert main([*args, "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fuselab bench")
    assert "error: warm-up workers run beside one process, not under torchrun (--gpus N)" in err[0]
    assert not (tmp_path / "r.jsonl").exists()  # nothing timed
