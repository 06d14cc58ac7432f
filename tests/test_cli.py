"""The CLI end to end on the CPU, through `python -m fuselab` as users (and the GPU machine) run it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USERFN = ROOT / "tests" / "data" / "userfn.py"


def fuselab(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """`python -m fuselab ARGS` against `cache` (the `cache` fixture: fake ceilings, so no run measures this CPU's;
    `fuselab device --quick` measuring for real is tests/cli/test_provenance_files.py's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FUSELAB_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_help_lists_the_commands(cache):
    out = fuselab("--help", cache=cache)
    assert out.returncode == 0
    for command in ("device", "check", "bench"):
        assert command in out.stdout


def test_version_and_list(cache, monkeypatch):
    import fuselab as package
    from fuselab.ops import all_ops

    assert fuselab("--version", cache=cache).stdout.strip() == f"fuselab {package.__version__}"
    monkeypatch.setenv("COLUMNS", "250")  # one line per row
    out = fuselab("list", "--device", "cpu", cache=cache)
    assert out.returncode == 0
    rows = [line for line in out.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == sum(len(op.impls) for op in all_ops())  # one row per impl of every registered op
    cuda = next(line for line in rows if "│ gelu " in line and "│ cuda " in line)
    assert "no: cuda runs on cuda only" in cuda
    triton = next(line for line in rows if "│ gelu " in line and "│ triton " in line)
    assert "yes" in triton and "interpreter" in triton


def test_bench_a_user_function_writes_json_csv_plot_and_resumes(tmp_path, cache):
    args = ["bench", f"{USERFN}:scaled_tanh", "--shape", "1000", "--shape", "2^12", "--dtype", "fp32"]
    args += ["--rep-ms", "5", "--warmup-ms", "1", "--out", str(tmp_path / "r.json")]
    args += ["--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "r.png")]
    out = fuselab(*args, cache=cache)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    rows = result["records"]
    assert [r["shape"] for r in rows] == [[1000], [4096]]
    assert all(r["error"] is None and r["median_ms"] > 0 and r["gbps"] > 0 for r in rows)
    assert all(r["rel_err"] < 1e-6 for r in rows)  # the float32 run against the same function in float64
    assert rows[0]["pct_copy"] == pytest.approx(10 * rows[0]["gbps"])  # against the cache's fake 10 GB/s
    assert all(r["pct_copy_same"] == pytest.approx(100 * r["gbps"] / r["copy_same_gbps"]) for r in rows)
    env = result["meta"]["env"]
    assert env["torch"] and env["revision"] and env["host"] and env["threads"] >= 1 and env["written"]
    assert (tmp_path / "r.csv").read_text().startswith("op,")
    assert (tmp_path / "r.png").stat().st_size > 5000

    again = fuselab(*args, cache=cache)  # everything is done: nothing is measured again
    assert again.returncode == 0
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2


def test_a_failing_function_is_an_error_row_not_a_crash(tmp_path, cache):
    out = fuselab(
        "bench",
        f"{USERFN}:broken",
        "--shape",
        "10",
        "--dtype",
        "fp32",
        "--rep-ms",
        "1",
        "--out",
        str(tmp_path / "r.jsonl"),
        cache=cache,
    )
    assert out.returncode == 1, out.stderr  # every case failed: the run did not do what was asked
    (row,) = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert "always fails" in row["error"] and row["status"] == "error"


def test_check_a_user_function(cache):
    out = fuselab("check", f"{USERFN}:add", "--nargs", "2", "--shape", "333", "--dtype", "fp32", cache=cache)
    assert out.returncode == 0, out.stderr
    assert "1 passed, 0 failed" in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "nosuchop"], "unknown op 'nosuchop'"),
        (["bench", "tests/data/userfn.py:missing"], "has no function 'missing'"),
        (["bench", f"{USERFN}:add", "--dtype", "int7"], "unknown dtype 'int7'"),
        (["bench", f"{USERFN}:add", "--shape", "12xq"], "bad shape"),
        (["bench", "gelu", "--out", "x.txt"], "give FILE.json (with FILE.jsonl as the resumable log) or FILE.jsonl"),
        (["inspect", "gelu", "--impl", "torch"], "fuselab inspect: error: gelu-torch-float32: inspect shows Triton"),
    ],
)
def test_bad_input_gets_a_clear_error(cache, args, message):
    out = fuselab(*args, cache=cache)
    assert out.returncode == 2
    assert message in out.stderr


def test_bench_speed_axis_is_what_varies():
    """Sizes that differ in element count are plotted against it; a sweep at one element count (softmax's widths)
    against the last dimension instead of a single column of points."""
    from fuselab.bench.record import Case, Row, Status
    from fuselab.evaluate.choices import speed_axis
    from fuselab.ops import get_op

    op = get_op("softmax")
    sizes = [Row(Case.of("softmax", "torch", "float32", (n,)), numel=n) for n in (16, 64)]
    points, _, label = speed_axis(sizes, op)
    assert label == "elements" and [p["x"] for p in points] == [16, 64]
    widths = [Row(Case.of("softmax", "torch", "float32", (4096 // w, w)), numel=4096) for w in (128, 512)]
    widths.append(Row(Case.of("softmax", "torch", "float32", (1, 7)), status=Status.ERROR, error="oom"))
    points, _x, label = speed_axis(widths, op)
    assert label == "last dimension" and [p["x"] for p in points] == [128, 512, 7]
    attention = get_op("attention")  # an op with its own axis (N) and panels (head dim)
    rows = [Row(Case.of("attention", "sdpa", "bfloat16", (8, 16, n, 64), {"causal": True})) for n in (512, 2048)]
    points, _, label = speed_axis(rows, attention)
    assert label == "N" and [p["x"] for p in points] == [512, 2048]
    assert points[0]["panel"] == "bf16 causal=True d=64"
