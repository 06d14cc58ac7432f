"""A newcomer's first hour (issue 14), through the real command in a subprocess: exit codes, one-line errors, device
errors, output paths checked first, the Triton interpreter skipped when timing, progress without a terminal,
oversized cases refused, a user's module found in the current folder."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
USERFN = ROOT / "tests" / "data" / "userfn.py"
FAST = ["--rep-ms", "5", "--warmup-ms", "1"]


def fuselab(*args: str, cache: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FUSELAB_CACHE": str(cache)}
    env.pop("FUSELAB_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=env, timeout=120, cwd=cwd
    )


def one_line_error(out: subprocess.CompletedProcess, command: str, message: str) -> None:
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"fuselab {command}: error: "), out.stderr
    assert message in lines[0], out.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "gelu", "--device", "tpu"], "unknown device 'tpu'; accepted: cpu, cuda"),
        (["check", "gelu", "--device", "tpu"], "unknown device 'tpu'"),
        (["profile", "gelu", "--device", "tpu"], "unknown device 'tpu'"),
        (["bench", "gelu", "--shape", "0"], "bad shape '0'"),
        (["bench", "gelu", "--rep-ms", "-1"], "--rep-ms: must be > 0, got -1"),
        (["bench", "gelu", "--dtype", "fp64"], "gelu does not take float64; accepted: float32, float16, bfloat16"),
        (["check", "gelu", "--out", "/proc/x.json"], "cannot write /proc/x.json"),
        (["bench", "gelu", "--plot", "/proc/x.png"], "cannot write /proc/x.png"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cache, args, message):
    out = fuselab(*args, cache=cache)
    assert out.returncode == 2
    one_line_error(out, args[0], message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("command", ["bench gelu", "check gelu", "device", "report"])
def test_cuda_without_a_gpu_is_one_line_in_every_command(cache, command):
    out = fuselab(*command.split(), "--device", "cuda", cache=cache)
    assert out.returncode == 2
    one_line_error(out, command.split()[0], "no CUDA GPU in this process; use --device cpu")


def test_check_exits_1_when_nothing_could_be_checked_on_the_device_asked_for(cache):
    out = fuselab("check", "gelu", "--impl", "cuda", "--device", "cpu", "--shape", "17", cache=cache)
    assert out.returncode == 1, out.stderr
    assert "0 passed, 0 failed" in out.stdout and "nothing could be checked on cpu" in out.stdout


def test_bench_exits_1_when_every_case_fails(cache, tmp_path):
    out = fuselab("bench", f"{USERFN}:broken", "--shape", "10", "--dtype", "fp32", *FAST, cache=cache)
    assert out.returncode == 1, out.stderr
    assert "broken (fp32; 1 case) error: RuntimeError: this function always fails" in out.stdout


def test_bench_skips_the_triton_interpreter_and_shows_progress_without_a_terminal(cache, tmp_path):
    log = tmp_path / "g.jsonl"
    args = ["bench", "gelu", "--impl", "torch,triton", "--shape", "1000", "--shape", "3001", "--dtype", "fp32"]
    out = fuselab(*args, "--opt", "approximate=tanh", *FAST, "--out", str(log), cache=cache)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["impl"], r["status"]) for r in rows] == [("torch", "ok"), ("triton", "skipped")] * 2
    assert "interpreter" in rows[1]["error"] and "correctness only" in rows[1]["error"]
    # one line for the skipped impl, without an exception's type in front of the reason
    assert "triton (fp32; 2 cases) skipped: the Triton interpreter on the CPU is for correctness only" in out.stdout
    assert "bench gelu [4/4]" in out.stderr  # progress, though stderr is a pipe

    again = fuselab(*args, "--opt", "approximate=tanh", *FAST, "--out", str(log), cache=cache)
    assert again.returncode == 0
    assert f"resuming {log}: 2 of 4 cases done, 2 to run" in again.stderr


def test_a_case_that_cannot_fit_is_refused_before_it_allocates(cache, tmp_path):
    """Beside a case that fits, one that does not is a refused row with its need (alone, it is a one-line error:
    tests/cli/test_huge_shapes.py)."""
    log = tmp_path / "big.jsonl"
    args = ["bench", "gelu", "--impl", "torch", "--dtype", "fp32", "--shape", "2^36", "--shape", "1000"]
    out = fuselab(*args, "--out", str(log), "--opt", "approximate=tanh", *FAST, cache=cache)
    assert out.returncode == 0, out.stderr
    rows = {r["shape"][0]: r for r in map(json.loads, log.read_text().splitlines())}
    assert rows[1000]["status"] == "ok"
    big = rows[2**36]
    assert big["status"] == "refused" and "free on cpu" in big["error"] and "needs about" in big["error"]


def test_a_module_in_the_current_folder_is_found_and_a_non_tensor_result_is_a_clear_error(cache, tmp_path):
    (tmp_path / "mymodule.py").write_text("def my_fn(a, b):\n    return a * b + 1\n\n\ndef count(x):\n    return 3\n")
    out = fuselab("bench", "mymodule:my_fn", "--nargs", "2", "--shape", "33x7", "--dtype", "fp32", *FAST,
                  cache=cache, cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "my_fn" in out.stdout and "fp32" in out.stdout

    bad = fuselab("bench", "mymodule:count", "--shape", "10", "--dtype", "fp32", *FAST, cache=cache, cwd=tmp_path)
    assert bad.returncode == 1
    assert "mymodule:count returned int, not a torch.Tensor" in bad.stdout

    missing = fuselab("bench", "nosuchmodule:fn", cache=cache, cwd=tmp_path)
    assert missing.returncode == 2
    one_line_error(missing, "bench", "no module named 'nosuchmodule' in the current folder")
    assert "PYTHONPATH" in missing.stderr and ".py:FUNCTION" in missing.stderr
