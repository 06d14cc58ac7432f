"""`fuselab bench` as a user reads it on the CPU: what its table and lines flag."""

import json

from fuselab.bench import ceilings, results
from fuselab.cli import bench as bench_cli
from fuselab.cli import main


def test_bench_says_when_its_ceilings_were_measured_on_a_busy_cpu(tmp_path, monkeypatch, capsys):
    """Ceilings measured while the CPU was busy read low: bench says so under
    its table, each row's warnings say so, and the results file holds them as they are."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    measured = {"copy_gbps": 1.0, "matmul_tflops": {"fp32": 0.01}, "cpu_busy": 0.6, "quick": False}
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(measured))
    args = ["bench", "softmax", "--impl", "torch", "--shape", "8x128", "--dtype", "fp32", "--device", "cpu"]
    args += ["--rep-ms", "2", "--warmup-ms", "1", "--call-cost-ms", "0", "--out", str(tmp_path / "r.json")]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "ceilings were measured while the CPU was busy (some task waited for a CPU 60% of the time)" in out
    (row,) = json.loads((tmp_path / "r.json").read_text())["records"]
    assert any("ceilings were measured while the CPU was busy" in w for w in row["warnings"])


def _low_ceilings(tmp_path, monkeypatch) -> None:
    """Cached ceilings far below what the CPU does (as a busy measurement once left them): every rate passes them."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"copy_gbps": 1e-6, "matmul_tflops": {"fp32": 1e-9}, "quick": False}))


def _cells(out: str, impl: str) -> list[str]:
    """The cells of the table's row of `impl`."""
    line = next(line for line in out.splitlines() if line.startswith(f"│ {impl} "))
    return [cell.strip() for cell in line.strip("│").split("│")]


def _headers(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("┃"))
    return [cell.strip() for cell in line.strip("┃").split("┃")]


def test_bench_marks_each_rate_past_its_ceiling_in_the_table_and_says_what_it_means(tmp_path, monkeypatch, capsys):
    """A memory-bound op's % copy and a compute-bound op's % peak past ABOVE_CEILING_PCT carry '!' in their cells,
    and a line under the table names the cases and what it means."""
    from fuselab.evaluate import ABOVE_CEILING_NOTE, ABOVE_CEILING_PCT, ABOVE_PEAK_NOTE

    _low_ceilings(tmp_path, monkeypatch)
    monkeypatch.setenv("COLUMNS", "250")
    fast = ["--dtype", "fp32", "--device", "cpu", "--rep-ms", "2", "--warmup-ms", "1", "--call-cost-ms", "0"]
    assert main(["bench", "softmax", "--impl", "torch", "--shape", "8x128", *fast]) == 0
    out = capsys.readouterr().out
    cells = dict(zip(_headers(out), _cells(out, "torch"), strict=True))
    assert cells["% copy"].endswith("!")
    same = cells["% copy same size"]
    assert same.endswith("!") == (float(same.rstrip("!~")) > ABOVE_CEILING_PCT)
    flat = " ".join(out.split())
    assert "torch at fp32 8x128" in flat and ABOVE_CEILING_NOTE in flat
    args = ["bench", "attention", "--impl", "sdpa", "--shape", "1x2x64x32", "--opt", "causal=false", *fast]
    assert main(args) == 0
    out = capsys.readouterr().out
    cells = dict(zip(_headers(out), _cells(out, "sdpa"), strict=True))
    assert cells["% peak"].endswith("!")
    flat = " ".join(out.split())
    assert "sdpa at fp32 1x2x64x32" in flat and ABOVE_PEAK_NOTE in flat


def test_bench_plot_of_a_compute_bound_op_draws_each_panels_own_ceiling(tmp_path, monkeypatch):
    """`bench attention --plot`: each dtype's panel gets its dtype's matmul peak as the ceiling (as the report's plot
    does), not none."""

    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    measured = {"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.2, "bf16": 0.5}, "quick": False}
    path.write_text(json.dumps(measured))
    drawn = {}

    def plot(points, out, *, ceiling=None, panel=None, **kwargs):
        for name in {p[panel] for p in points}:
            drawn[name] = ceiling([p for p in points if p[panel] == name]) if callable(ceiling) else ceiling
        return results.plot_metric(points, out, ceiling=ceiling, panel=panel, **kwargs)

    monkeypatch.setattr(bench_cli, "plot_metric", plot)
    args = ["bench", "attention", "--impl", "sdpa", "--shape", "1x2x64x32", "--opt", "causal=false", "--device"]
    args += ["cpu", "--dtype", "fp32", "--dtype", "bf16", "--rep-ms", "2", "--warmup-ms", "1", "--call-cost-ms", "0"]
    assert main([*args, "--plot", str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a.png").stat().st_size > 0
    peaks = {"fp32": ceilings.peak_tflops(measured, "float32"), "bf16": ceilings.peak_tflops(measured, "bfloat16")}
    assert drawn == {f"{dtype} causal=False d=32": peak for dtype, peak in peaks.items()}


def test_bench_beside_other_work_says_the_cpu_was_busy(tmp_path, monkeypatch, capsys, busy_cpu):
    """`fuselab bench softmax` beside matmul processes: the medians carry '~', a line names how busy the CPU was and
    what that does to the times (steady, but inflated), and each row's warnings say so."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"copy_gbps": 10.0, "matmul_tflops": {"fp32": 0.1}, "quick": False}))
    monkeypatch.setenv("COLUMNS", "250")
    args = ["bench", "softmax", "--impl", "torch", "--shape", "64x64", "--dtype", "fp32", "--device", "cpu"]
    args += ["--rep-ms", "20", "--warmup-ms", "10", "--call-cost-ms", "0", "--out", str(tmp_path / "r.json")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert _cells(out, "torch")[3].endswith("~")
    flat = " ".join(out.split())
    assert "1 of 1 timings ran while the CPU was busy with other work" in flat, flat
    (row,) = json.loads((tmp_path / "r.json").read_text())["records"]
    assert row["cpu_busy"] > 0.1 and any("the CPU was busy" in w for w in row["warnings"])


def test_bench_plots_the_cost_of_a_call(tmp_path, monkeypatch, capsys) -> None:
    """--plot-calls draws host and end-to-end us per call against size, one line per impl and measure, a panel per
    dtype and pass; it refuses --call-cost-ms 0."""
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    drawn = {}

    def plot(points, out, **kwargs):
        drawn.update(series={p["series"] for p in points}, panels={p["panel"] for p in points}, y=kwargs["y"])
        return results.plot_metric(points, out, **kwargs)

    monkeypatch.setattr(bench_cli, "plot_metric", plot)
    args = ["bench", "gelu", "--impl", "torch,naive", "--shape", "2^8", "--shape", "2^12", "--device", "cpu"]
    args += ["--dtype", "fp32", "--opt", "approximate=tanh", "--backward", "--rep-ms", "2", "--warmup-ms", "1"]
    assert main([*args, "--call-cost-ms", "2", "--plot-calls", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0
    assert drawn["series"] == {f"{i} {m}" for i in ("torch", "naive") for m in ("host", "end to end")}
    assert drawn["panels"] == {"fp32 approximate=tanh", "fp32 approximate=tanh forward+backward"}
    capsys.readouterr()
    assert main([*args, "--call-cost-ms", "0", "--plot-calls", str(tmp_path / "d.png")]) != 0
    assert "--plot-calls needs the cost of a call" in capsys.readouterr().err
