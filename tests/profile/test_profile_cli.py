"""`fuselab profile` and `fuselab inspect` end to end on the CPU, through `python -m fuselab`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuselab.profile.inspect import find_tool

ROOT = Path(__file__).resolve().parents[2]


def fuselab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FUSELAB_CACHE": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd
    )


def test_profile_a_case_writes_trace_table_timeline(tmp_path):
    out = fuselab(
        "profile", "--case", "matmul128", "--device", "cpu", "--iters", "2", "--stacks", "--out", "p", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "aten::matmul" in out.stdout
    files = {p.name for p in (tmp_path / "p").iterdir()}
    assert files == {"trace.json", "table.json", "table.txt", "timeline.png", "stacks_cpu.txt"}
    table = json.loads((tmp_path / "p" / "table.json").read_text())
    assert table["ops"][0]["name"] == "aten::matmul" and table["ops"][0]["calls"] == 2
    assert "aten::matmul" in (tmp_path / "p" / "table.txt").read_text()


def test_profile_a_user_function_and_a_script(tmp_path):
    out = fuselab(
        "profile",
        str(ROOT / "tests/data/userfn.py") + ":add",
        "--nargs",
        "2",
        "--shape",
        "1000",
        "--sort",
        "calls",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "fuselab-profile" / "add-1000-float32" / "trace.json").exists()
    script = tmp_path / "s.py"
    script.write_text("import torch\nprint('script ran', torch.ones(3).cumsum(0)[-1].item())\n")
    out = fuselab("profile", "--script", str(script), "--out", "s", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("script ran 3.0") == 2  # warm-up, then the profiled run
    assert "aten::cumsum" in (tmp_path / "s" / "table.txt").read_text()


def test_profile_runahead_on_the_cpu(tmp_path):
    out = fuselab(
        "profile",
        "--runahead",
        "--steps",
        "3",
        "--layers",
        "2",
        "--dim",
        "32",
        "--batch",
        "8",
        "--out",
        "ra",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "no GPU" in out.stdout and "plain" in out.stdout and "print" in out.stdout
    data = json.loads((tmp_path / "ra" / "runahead.json").read_text())
    assert [r["name"] for r in data["runs"]] == ["plain", "print"]
    assert (tmp_path / "ra" / "timeline_print.png").stat().st_size > 10_000


def test_profile_bad_input_says_what_is_accepted(tmp_path):
    out = fuselab("profile", "nosuchop", cwd=tmp_path)
    assert out.returncode == 2 and "known ops" in out.stderr  # one line on stderr, as every command
    out = fuselab("profile", cwd=tmp_path)
    assert out.returncode == 2 and "--case" in out.stderr


@pytest.mark.skipif(find_tool("nvcc") is None, reason="nvcc not found")
def test_inspect_cuda_impl(tmp_path):
    out = fuselab("inspect", "gelu", "--impl", "cuda", "--arch", "sm_90", "--out", "i", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "registers/thread" in out.stdout and "global loads" in out.stdout
    assert (tmp_path / "i" / "inspect.json").exists()


def test_profile_an_op_forward_and_backward(tmp_path):
    """--backward profiles forward + backward: the attention backward's own operators appear in the table; an impl
    without a backward and a lecture case are refused with a line that says why."""
    out = fuselab("profile", "attention", "--impl", "naive", "--shape", "1x2x33x16", "--device", "cpu", "--iters", "1",
                  "--backward", "--out", "p", cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    table = json.loads((tmp_path / "p" / "table.json").read_text())
    names = {row["name"] for row in table["ops"]}
    assert any("Backward" in name for name in names), sorted(names)[:20]
    refused = fuselab("profile", "--case", "matmul128", "--backward", "--device", "cpu", cwd=tmp_path)
    assert refused.returncode != 0 and "--backward profiles an op" in refused.stderr


def test_impl_callable_forward_and_backward() -> None:
    import torch

    from fuselab.bench.sweep import Unavailable
    from fuselab.ops.registry import get_op
    from fuselab.profile.capture import impl_callable

    op = get_op("attention")
    grads = impl_callable(op, "naive", (1, 2, 17, 16), torch.float32, "cpu", backward=True)()
    assert len(grads) == 3 and all(g.shape == (1, 2, 17, 16) and g.abs().sum() > 0 for g in grads)
    assert not get_op("softmax").get_impl("triton-elementwise").backward
    with pytest.raises(Unavailable, match="has no backward"):
        impl_callable(get_op("softmax"), "triton-elementwise", (7, 33), torch.float32, "cpu", backward=True)
