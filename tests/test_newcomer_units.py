"""A newcomer's first hour (issue 14), below the CLI: the results log, tables, the timer's output, fuselab.nn as a
drop-in for torch.nn, noisy timings in tables and claims, the profiler's stray lines, the README."""

import io
import json
import os
import re
import warnings
from pathlib import Path

import pytest
import torch
from rich.console import Console

from fuselab.bench import log as results_log
from fuselab.bench import sweep
from fuselab.bench.results import fmt_rate, make_table, print_table
from fuselab.bench.sweep import append_record, grid, load_records, run_sweep
from fuselab.bench.timer import Measurement, Measurements, benchmark, benchmark_side_by_side

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- the results log


def test_each_record_is_one_write_on_an_append_descriptor(tmp_path, monkeypatch):
    writes, flags = [], []
    real_open, real_write = os.open, os.write
    monkeypatch.setattr(results_log.os, "open", lambda path, f, *a: flags.append(f) or real_open(path, f, *a))
    monkeypatch.setattr(results_log.os, "write", lambda fd, data: writes.append(data) or real_write(fd, data))
    record = {"n": 7, "warnings": ["x" * 5000], "key": "k"}
    append_record(tmp_path / "r.jsonl", record)
    assert len(writes) == 1 and writes[0].endswith(b"\n") and json.loads(writes[0]) == record
    assert flags[0] & os.O_APPEND


def test_a_torn_tail_is_cut_off_with_a_warning_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "r.jsonl"
    cases = grid(n=[1, 2, 3])
    run_sweep(cases[:2], lambda c: {"double": 2 * c["n"]}, out, show_progress=False)
    with out.open("a") as f:  # a run killed in the middle of writing case 3
        f.write('{"n": 3, "double": 6, "warnings": ["I')
    messages = []
    with pytest.warns(sweep.SweepWarning, match="last line was cut short"):
        rows = run_sweep(cases, lambda c: {"double": 2 * c["n"]}, out, show_progress=False, log=messages.append)
    assert messages == [f"resuming {out}: 2 of 3 cases done, 1 to run"]
    assert [r["double"] for r in rows] == [2, 4, 6]
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["status"] == "ok" for line in lines)  # every line whole
    assert len(load_records(out)) == 3


def test_a_case_not_run_on_purpose_keeps_its_reason_without_an_exception_type(tmp_path):
    class Unfit(sweep.NotRun):
        status = "refused"

    def run(case):
        raise Unfit("needs 96 GiB, 22 GiB free")

    (row,) = run_sweep(grid(n=[1]), run, tmp_path / "r.jsonl", show_progress=False)
    assert row["status"] == "refused" and row["error"] == "needs 96 GiB, 22 GiB free"


def test_progress_without_a_terminal_is_a_line_per_finished_case(monkeypatch):
    monkeypatch.setattr(sweep, "PROGRESS_EVERY_S", 0.0)
    lines = []
    run_sweep(grid(n=[1, 2, 3]), lambda c: {}, None, description="bench toy", log=lines.append)
    assert [line.split(":")[0] for line in lines] == [f"bench toy [{i}/3] {i}" for i in (1, 2, 3)]


# ---------------------------------------------------------------------------------------------- refusing big cases


def test_a_case_bigger_than_free_memory_is_refused_before_any_input_is_made(monkeypatch):
    from fuselab.evaluate import cases as evaluate
    from fuselab.ops.registry import get_op

    op = get_op("gelu")
    monkeypatch.setattr(evaluate, "free_bytes", lambda device: 3 * 2**30)
    n = 100_000_007  # x and y in fp32 (8 B an element), and the float64 reference's counted twice (2 x 16 B)
    with pytest.raises(evaluate.TooBig, match=rf"needs about {evaluate.format_bytes(40 * n)} .*, 3 GiB free on cpu"):
        evaluate.refuse_if_too_big(op, (n,), torch.float32, "cpu")
    evaluate.refuse_if_too_big(op, (3001, 1013), torch.float32, "cpu")  # fits: no error


def test_free_memory_is_known_on_the_cpu():
    from fuselab.bench.memory import free_bytes

    assert 0 < free_bytes("cpu") < 2**50


# ---------------------------------------------------------------------------------------------- tables and timer


def bench_rows() -> list[dict]:
    row = {"impl": "compile", "dtype": "bfloat16", "shape": [4096, 1023], "median_ms": 1.234, "iqr_ms": 0.5}
    quiet = {**row, "impl": "torch", "iqr_ms": 0.01, "gbps": 0.0123}
    return [{**row, "gbps": 3.41}, quiet, {**row, "impl": "cuda", "error": "CUDA C++ kernels need an NVIDIA GPU"}]


def test_tables_at_80_columns_do_not_fold_cells_and_mark_noisy_medians():
    from fuselab.cli.bench import columns

    buffer = io.StringIO()
    table = make_table(bench_rows(), columns("torch", ["approximate"]), title="bench", mark_noisy="median_ms")
    print_table(table, Console(file=buffer, width=80))
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("│")]
    assert len(lines) == 3  # one line per row: nothing folded
    assert "4096x1023" in lines[0] and "bf16" in lines[0] and "1.234~" in lines[0] and "3.41" in lines[0]
    assert "1.234~" not in lines[1] and "0.0123" in lines[1]
    assert "error: CUDA C++ kernels need an NVIDIA GPU" in lines[2]


def test_rates_keep_the_decimals_small_values_need():
    assert [fmt_rate(v) for v in (4093.4, 51.23, 3.416, 0.04123, 0.0)] == ["4093", "51.2", "3.42", "0.0412", "0"]
    from fuselab.cli.device import flops_rate

    assert flops_rate(0.0412) == "41.2 GFLOP/s" and flops_rate(685.2) == "685 TFLOP/s"


def test_unmeasured_rows_print_one_line_each_without_the_exception_path():
    from fuselab.bench.record import Case, Row, Status
    from fuselab.cli.bench import not_measured_lines

    why = "cuda runs on cuda only, not on cpu"
    rows = [Row(Case.of("gelu", "cuda", d, (7,)), status=Status.UNAVAILABLE, error=why) for d in ("fp32", "bf16")]
    assert not_measured_lines(rows) == [
        "[yellow]cuda[/yellow] (fp32, bf16; 2 cases) unavailable: cuda runs on cuda only, not on cpu"
    ]


def test_cpu_default_shapes_are_scaled_down_keeping_the_row_width():
    from fuselab.evaluate.choices import cap_numel

    assert cap_numel([(2**24,), (2**28,)], 2**20) == [(2**20,)]
    assert cap_numel([(2**26 // 128, 128), (256, 262144), (3, 5)], 2**20) == [(8192, 128), (4, 262144), (3, 5)]


def test_a_compute_bound_op_is_scaled_to_the_cpu_by_flops_keeping_its_sequences_long():
    from fuselab.evaluate.choices import CPU_DEFAULT_FLOPS, bench_cases
    from fuselab.ops import all_ops

    for op in [op for op in all_ops() if op.bound == "compute"]:
        chosen = bench_cases(op, "cpu", None, None)
        options = op.default_options()
        assert chosen.shapes and "FLOPs a call" in chosen.notes[0]
        for shape in chosen.shapes:
            assert op.flops(shape, **options) <= CPU_DEFAULT_FLOPS
            assert op.flops((2 * shape[0], *shape[1:]), **options) > CPU_DEFAULT_FLOPS / 2  # not shrunk past need
            assert min(shape[-2:]) >= 16, shape  # a sequence and a head, not N = 1
        assert bench_cases(op, "cuda", None, None).shapes is None  # on a GPU: the op's own shapes


def test_cuda_graph_on_the_cpu_is_an_error_not_ignored():
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
        benchmark(lambda: None, device="cpu", cuda_graph=True)


def test_side_by_side_prints_as_a_table():
    x = torch.randn(1000)
    timed = benchmark_side_by_side(
        {"tanh": lambda: torch.tanh(x), "exp": lambda: torch.exp(x)},
        device="cpu", rounds=2, warmup_ms=1, rep_ms=2, min_reps=4,
    )  # fmt: skip
    assert isinstance(timed, Measurements) and set(timed) == {"tanh", "exp"}
    text = str(timed)
    assert text == repr(timed) and "samples_ms" not in text and "[" not in text
    assert text.splitlines()[0].split() == ["name", "median", "IQR", "runs", "x", "fastest"]
    assert min(float(line.split()[-1]) for line in text.splitlines()[1:3]) == 1.0
    assert "samples_ms" not in repr(Measurement([1.0, 2.0, 3.0], mode="perf_counter", device="cpu"))


# ---------------------------------------------------------------------------------------------- fuselab.nn


def test_gelu_defaults_like_torch_nn_gelu():
    from fuselab.nn import GELU

    x = torch.randn(37, 129, dtype=torch.float64)
    assert GELU(impl="torch").approximate == torch.nn.GELU().approximate == "none"
    torch.testing.assert_close(GELU(impl="torch")(x), torch.nn.GELU()(x), rtol=0, atol=0)  # float64 by torch
    with pytest.raises(TypeError):
        GELU("tanh", "torch")  # impl is keyword-only


@pytest.mark.parametrize("dim", [-1, 0, 1, 2, -2])
def test_softmax_takes_dim_like_torch_nn_softmax_on_any_axis(dim):
    from fuselab.nn import Softmax

    x = torch.randn(3, 5, 7, dtype=torch.float64)
    for module in (Softmax(dim, impl="torch"), Softmax(dim=dim, impl="torch"), Softmax(dim, impl="naive")):
        expected = torch.nn.Softmax(dim)(x)
        got = module(x if module.impl == "torch" else x.float())
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-7)


def test_softmax_dim_none_and_keyword_only_impl():
    from fuselab.nn import Softmax

    x = torch.randn(4, 6)
    with pytest.warns(UserWarning, match="dim=None"):
        got = Softmax(impl="torch")(x)
    torch.testing.assert_close(got, torch.softmax(x, dim=1))  # torch.nn.Softmax(None) picks dim 1 for 2-D
    with pytest.raises(TypeError, match="impl is a keyword"):
        Softmax("torch")
    with pytest.raises(TypeError):
        Softmax(-1, "torch")


def test_softmax_dim_none_compiles_fullgraph_and_warns_once():
    from fuselab.nn import Softmax

    with pytest.warns(UserWarning, match="dim=None") as caught:
        module = Softmax(impl="torch")
    assert len(caught) == 1
    x = torch.randn(4, 6)
    compiled = torch.compile(module, fullgraph=True, backend="eager")  # a warning in forward was a graph break
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none per call
        torch.testing.assert_close(compiled(x), torch.softmax(x, dim=1))
        torch.testing.assert_close(module(x), torch.softmax(x, dim=1))


# ---------------------------------------------------------------------------------------------- noisy claims


def test_a_claim_resting_on_a_noisy_timing_says_so():
    from fuselab.studies import claims

    def row(impl: str, median: float, iqr: float) -> dict:
        return {"impl": impl, "dtype": "float32", "approximate": "tanh", "numel": 2**20, "shape": [2**20],
                "median_ms": median, "iqr_ms": iqr, "gbps": 1.0, "pct_copy": 50.0}  # fmt: skip

    quiet = {"gelu": {"bench": [row("naive", 4.0, 0.1), row("torch", 1.0, 0.01)]}}
    noisy = {"gelu": {"bench": [row("naive", 4.0, 2.0), row("torch", 1.0, 0.01)]}}
    (before,) = [c for c in claims.evaluate_claims(quiet) if c["section"] == "gelu" and "naive" in c["figure"]][:1]
    (after,) = [c for c in claims.evaluate_claims(noisy) if c["claim"] == before["claim"]]
    assert before["held"] is True and not before["noisy"] and "~" not in before["figure"]
    assert after["noisy"] and "rests on a noisy timing (naive float32: IQR 50% of the median)" in after["figure"]
    assert claims.verdict(after["held"], after["noisy"]).endswith("~")


# ---------------------------------------------------------------------------------------------- profiler, README


def test_the_profiler_prints_no_stray_lines(capfd):
    from fuselab.profile.capture import profile_callable

    x = torch.randn(100)
    profile_callable(lambda: x + 1, warmup=0, iters=1)
    assert "USDT" not in capfd.readouterr().err


def test_readme_says_how_to_run_the_cli_after_make():
    readme, makefile = (ROOT / "README.md").read_text(), (ROOT / "Makefile").read_text()
    assert "source .venv/bin/activate" in readme and 'make run ARGS="device"' in readme
    assert re.search(r"^run: setup\n\t\$\(BIN\)/fuselab \$\(ARGS\)$", makefile, re.M)
    assert re.search(r"^\t\$\(BIN\)/fuselab report --out report \$\(ARGS\)$", makefile, re.M)


def test_fuselab_nn_functional_is_an_attribute_of_fuselab_nn():
    import subprocess
    import sys

    # in a fresh interpreter: fuselab.nn.functional reached as an attribute before any import of it (it recursed)
    code = "import fuselab.nn; print(fuselab.nn.functional.scaled_dot_product_attention.__name__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "scaled_dot_product_attention", done.stderr[-500:]
