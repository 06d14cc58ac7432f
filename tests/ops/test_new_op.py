"""Adding an op touches only its definition: a toy op registered from a test module (tests/ops/toy_op.py) shows up
in `fuselab check`, `bench`, `profile`, `inspect`, the quick report, and the claims, with no edit anywhere else."""

import json

import pytest
import toy_op  # tests/ops/toy_op.py (pytest puts this folder on sys.path)

from fuselab.cli import main
from fuselab.ops.registry import all_ops, get_op
from fuselab.studies.claims import evaluate_claims


@pytest.fixture
def toy():
    op = toy_op.register()
    yield op
    toy_op.unregister()


def test_registered_op_is_discovered_by_every_listing(toy):
    assert toy in all_ops() and get_op(toy_op.NAME) is toy
    assert toy.options["alpha"].parse("0.25") == 0.25
    texts = [c["claim"] for c in evaluate_claims({})]
    assert f"{toy_op.NAME}: a hand-written Triton kernel is about as fast as torch." in texts


def test_check_cli_runs_every_impl_of_the_new_op(toy, tmp_path, capsys):
    out = tmp_path / "check.json"
    assert main(["check", toy_op.NAME, "--dtype", "fp32", "--opt", "alpha=-1.5", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["records"]
    assert {r["impl"] for r in rows} == {"naive", "torch", "triton"}
    assert all(r["status"] == "pass" and r["alpha"] == -1.5 for r in rows)


def test_check_cli_counts_a_failure_of_pytorchs_own_impls_apart(toy, capsys):
    """An impl marked upstream (PyTorch's own) that fails is shown and counted apart: the exit status is fuselab's
    impls' (torch.softmax on the CPU misses the fp32 tolerance at rows of 40 000 now and then: docs/gate.md). The
    same failure in an impl of fuselab's exits 1."""

    def off(a, b, alpha=0.5):
        return (a + b * alpha) * 1.01

    toy.impl("upstream-off", upstream=True)(off)
    argv = ["check", toy_op.NAME, "--dtype", "fp32", "--device", "cpu", "--impl"]
    assert main([*argv, "naive,upstream-off"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" in out and "3 passed, 0 failed, 3 failed in PyTorch's own impls (not counted), 0 unavailable" in out
    assert main([*argv, "upstream-off"]) == 0  # nothing of fuselab's ran, and nothing of fuselab's failed
    capsys.readouterr()
    toy.impl("ours-off")(off)
    assert main([*argv, "naive,ours-off"]) == 1
    assert "3 passed, 3 failed, 0 unavailable" in capsys.readouterr().out


def test_bench_cli_times_the_new_op(toy, tmp_path):
    out = tmp_path / "bench.json"
    argv = [
        "bench",
        toy_op.NAME,
        "--impl",
        "naive,torch",
        "--dtype",
        "fp32",
        "--shape",
        "3001",
        "--rep-ms",
        "5",
        "--warmup-ms",
        "1",
    ]
    assert main([*argv, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["records"]
    assert {r["impl"] for r in rows} == {"naive", "torch"}
    assert all(r["median_ms"] > 0 and r["bytes"] == 3 * 3001 * 4 and r["bound"] == "memory" for r in rows)


def test_profile_cli_profiles_the_new_op(toy, tmp_path):
    out = tmp_path / "prof"
    assert main(["profile", toy_op.NAME, "--impl", "naive", "--shape", "4096", "--iters", "2", "--out", str(out)]) == 0
    assert (out / "table.json").exists()


def test_inspect_cli_compiles_the_new_ops_triton_kernel(toy, tmp_path):
    out = tmp_path / "asm"
    assert main(["inspect", toy_op.NAME, "--impl", "triton", "--shape", "4096", "--out", str(out)]) == 0
    summary = (out / "summary.txt").read_text()
    assert "scaled_add_kernel" in summary and "ld.global" in summary


def test_quick_report_has_a_section_for_the_new_op(toy, tmp_path):
    from fuselab.report import run_full_report

    run_full_report(tmp_path, device="cpu", quick=True, only=["device", toy_op.NAME], show_progress=False)
    md = (tmp_path / "report.md").read_text()
    section = md[md.index("## Toy: scaled add") :]
    assert "**Correctness**" in section and "| triton |" in section
    assert "GB/s" in section
