"""The run-ahead analysis: exact numbers on the handmade GPU-like traces, a real CPU run, a stored H200 trace."""

from pathlib import Path

import pytest

from fuselab.profile.runahead import (
    MLPConfig,
    RunAheadRun,
    RunAheadStudy,
    analyze_runahead,
    make_mlp,
    run_runahead,
    train,
)
from fuselab.profile.table import build_table
from fuselab.profile.trace import Trace

DATA = Path(__file__).resolve().parents[1] / "data"
H200_TRACE = DATA / "h200_runahead_trace.json"


def test_plain_loop_runs_ahead():
    # numbers worked out by hand in tests/profile/make_gpu_like_traces.py
    a = analyze_runahead(Trace.load(DATA / "profile" / "runahead_gpu_like_plain.json"))
    assert a.has_gpu and a.launches == 9 and not a.note
    assert a.lag_ms_median == pytest.approx(0.475) and a.lag_ms_max == pytest.approx(0.945)
    assert a.steps_ahead_max == 2 and a.steps_ahead_median == 1
    assert [s.step for s in a.steps] == [0, 1, 2]
    assert [s.kernels for s in a.steps] == [3, 3, 3]
    assert [s.gpu_behind_ms for s in a.steps] == pytest.approx([0.37, 0.72, 1.07])
    assert a.syncs == {"cudaDeviceSynchronize": 1} and a.host_reads == 0


def test_printing_the_loss_stops_the_run_ahead():
    a = analyze_runahead(Trace.load(DATA / "profile" / "runahead_gpu_like_print.json"))
    assert a.steps_ahead_max == 0
    assert a.lag_ms_max < 0.4  # never more than one step's own kernels queued
    assert a.syncs == {"DtoH copy": 3, "cudaStreamSynchronize": 3, "cudaDeviceSynchronize": 1}
    assert a.host_reads == 3
    assert all(s.gpu_behind_ms < 0 for s in a.steps)  # each step's GPU work is done before the CPU moves on


def test_study_reports_the_syncs_the_print_added(tmp_path):
    runs = [
        RunAheadRun(
            name,
            1.0,
            analyze_runahead(Trace.load(DATA / "profile" / f"runahead_gpu_like_{name}.json")),
            tmp_path / "t.json",
            tmp_path / "t.png",
        )
        for name in ("plain", "print")
    ]
    study = RunAheadStudy(MLPConfig(steps=3, layers=1, dim=8, batch=8, device="cuda"), runs)
    assert study.added_syncs == {"DtoH copy": 3, "cudaStreamSynchronize": 3}
    text = study.summary()
    assert "up to 2 step(s) ahead" in text and "the print added: DtoH copy +3, cudaStreamSynchronize +3;" in text
    assert study.to_json()["added_syncs"] == study.added_syncs


def test_training_loop_learns_and_is_seeded():
    cfg = MLPConfig(steps=5, layers=2, dim=16, batch=8, lr=0.1, device="cpu")
    model, opt, x, y = make_mlp(cfg)
    first = train(model, opt, x, y, 1).item()
    last = train(model, opt, x, y, 20).item()
    assert last < first
    model2, _, x2, _ = make_mlp(cfg)
    assert (x2 == x).all() and next(model2.parameters()).shape == (16, 16)


def test_study_on_the_cpu_degrades_gracefully(tmp_path):
    study = run_runahead(MLPConfig(steps=3, layers=2, dim=32, batch=16, device="cpu"), tmp_path, warmup_steps=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "loss_print.txt",
        "runahead.json",
        "summary.txt",
        "timeline_plain.png",
        "timeline_print.png",
        "trace_plain.json",
        "trace_print.json",
    ]
    plain, printed = study.runs
    assert plain.wall_ms > 0 and printed.wall_ms > 0
    for run in study.runs:
        assert not run.analysis.has_gpu and "no GPU" in run.analysis.note
        assert [s.step for s in run.analysis.steps] == [0, 1, 2]
    assert printed.analysis.host_reads == 3 and plain.analysis.host_reads == 0
    assert (tmp_path / "loss_print.txt").read_text().count("loss") == 1 + 3 + 3  # warm-up, timed, profiled
    assert "no GPU" in study.summary()


@pytest.mark.skipif(not H200_TRACE.exists(), reason=f"{H200_TRACE.name} not committed yet (made on the H200)")
def test_stored_h200_trace():
    trace = Trace.load(H200_TRACE)
    assert trace.has_gpu
    a = analyze_runahead(trace)
    assert a.steps and a.launches > 0 and a.lag_ms_max >= a.lag_ms_median >= 0
    assert a.steps_ahead_max is not None and a.steps_ahead_max >= 0
    assert all(s.kernels > 0 for s in a.steps)
    table = build_table(trace)
    launched = [k for op in table.ops for k in op.kernels]
    assert launched and sum(k.gpu_us for k in launched) == pytest.approx(table.gpu_total_us)
    assert any(lane.kind == "gpu" for lane in trace.lanes())
