"""The scripts the tree carries still run: every benchmarks/*.py imports (its names resolve against today's package,
it does nothing on import: a `__main__` guard) and parses its --help; every scripts/*.sh passes `bash -n`."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before a script defines a kernel)

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))


def test_there_are_scripts_to_check() -> None:
    assert BENCHMARKS and SCRIPTS


def has_main_guard(path: Path) -> bool:
    """Whether the module ends its top level in `if __name__ == "__main__":` (and does nothing else on import)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            return True
    return False


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_benchmark_imports_and_has_a_main_guard(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert has_main_guard(path), f"{path.name}: put the work under `if __name__ == '__main__':`"
    monkeypatch.setattr(sys, "argv", [str(path)])  # a script that parsed arguments on import would fail here
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # every import and module-level name resolves against today's package
    main = getattr(module, "main", None)
    assert callable(main), f"{path.name}: expected a main() the guard calls"
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])  # its arguments parse before any GPU work
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 0


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_shell_script_parses(path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not found")
    proc = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{path.name}: {proc.stderr.strip()}"


@pytest.mark.slow
def test_softmax_offline_audit_compiles_the_h200s_plans_without_a_gpu() -> None:
    """scripts/softmax_offline_audit.py plans as the H200 does and compiles what it would launch: fp32 split rows of a
    width no multiple of 16 read 16 bytes at a time in 64 registers (two programs an SM), and the looped backward of
    odd-width rows reads their bulk 16 bytes at a time; with --sass, the fp32 rows forward of 39 columns issues 8 of
    its 12 global loads before its first shuffle and the backward 16 of 24 (SASS read with the cuobjdump Triton
    ships)."""
    script = ROOT / "scripts" / "softmax_offline_audit.py"
    done = subprocess.run(
        [sys.executable, str(script), "--sass", "--dtype", "fp32", "163x47692", "278x17729", "168140x39"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r[0], r[1]): r[2:] for r in (line.split() for line in done.stdout.splitlines()[1:])}
    warps, registers, spilled, per_sm, _, _, widest, _ = rows[("163x47692", "_forward_split_kernel")]
    assert (warps, registers, spilled, per_sm, widest) == ("16", "64", "0", "2", "16"), rows
    assert rows[("278x17729", "_backward_looped_kernel")][-2] == "16", rows
    schedule = rows[("168140x39", "_forward_rows_kernel")][-1]
    assert schedule == "8/12", rows
    # the backward waits on memory once: 6 of 24 under an edge mask that took 1.21x its time (docs/ops/softmax.md)
    assert rows[("168140x39", "_backward_rows_kernel")][-1] == "16/24", rows


@pytest.mark.slow
def test_attention_offline_audit_compiles_the_h200s_plans_without_a_gpu() -> None:
    """scripts/attention_offline_audit.py plans as the H200 does (TMA kernels for bf16, the tuned plans) and compiles
    what it would launch: the forward, dK/dV and dQ kernels (delta in dQ) at d 80 causal, and a forced dK/dV plan of
    16 x 64 tiles, which ptxas holds without spilling, in place of the tuned one."""
    script = ROOT / "scripts" / "attention_offline_audit.py"
    shape = "2x8x2x3000x3000x80c"
    runs = {}
    for force in ([], ["--force", "dkdv=16,64,4,3"]):
        done = subprocess.run(
            [sys.executable, str(script), "--dtype", "bf16", *force, shape],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        runs[bool(force)] = {r[1]: r[2:] for r in (line.split() for line in done.stdout.splitlines()[1:])}
    tuned, forced = runs[False], runs[True]
    assert set(tuned) == {  # no delta kernel: the dQ kernel, which recomputes S and dP, writes delta
        "attention_fwd_tma_kernel",
        "attention_bwd_dkdv_tma_kernel",
        "attention_bwd_dq_tma_kernel",
    }, tuned
    tile, warps, registers, spilled, _, _, per_sm, _, _ = forced["attention_bwd_dkdv_tma_kernel"]
    assert (tile, warps, spilled) == ("16x64/3", "4", "0") and int(registers) <= 255 and int(per_sm) >= 2, forced
    assert tuned["attention_bwd_dkdv_tma_kernel"][0] != "16x64/3", tuned  # the table's own plan, not the forced one


@pytest.mark.slow
def test_attention_offline_audit_ptx_digests_change_with_the_kernel_code_only() -> None:
    """`--ptx-digest`: a digest per launch of the kernel's PTX code. A forced dK/dV plan (other tiles, so other code)
    changes the dK/dV kernel's digest, and the forward's and dQ's, compiled again in the second run, keep theirs."""
    script = ROOT / "scripts" / "attention_offline_audit.py"
    runs = []
    for force in ([], ["--force", "dkdv=16,64,4,3"]):
        done = subprocess.run(
            [sys.executable, str(script), "--ptx-digest", *force, "2x4x2x300x300x64c"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        lines = done.stdout.splitlines()
        assert lines[0].split() == ["shape", "kernel", "tile", "warps", "ptx_digest"], lines
        runs.append({r[1]: r[4] for r in (line.split() for line in lines[1:])})
    tuned, forced = runs
    assert {"attention_fwd_tma_kernel", "attention_bwd_dkdv_tma_kernel"} <= set(tuned) == set(forced), (tuned, forced)
    assert all(len(d) == 12 and int(d, 16) >= 0 for d in tuned.values()), tuned
    changed = {name for name in tuned if tuned[name] != forced[name]}
    assert changed == {"attention_bwd_dkdv_tma_kernel"}, (tuned, forced)


@pytest.mark.slow
def test_attention_offline_audit_compiles_the_stored_scores_path() -> None:
    """`--stored-scores yes`: the dK/dV kernel storing dS and the dQ kernel of one product that reads it, compiled as
    the H200 would launch them, in place of the dQ kernel that recomputes."""
    script = ROOT / "scripts" / "attention_offline_audit.py"
    done = subprocess.run(
        [sys.executable, str(script), "--dtype", "bf16", "--stored-scores", "yes", "2x4x2x300x300x128c"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = {line.split()[1]: line.split()[2:] for line in done.stdout.splitlines()[1:]}
    assert "attention_bwd_dq_ds_kernel" in kernels and "attention_bwd_dq_tma_kernel" not in kernels, kernels
    assert int(kernels["attention_bwd_dq_ds_kernel"][3]) == 0, kernels  # no spill


@pytest.mark.slow
def test_the_pointer_kernels_read_heads_of_no_multiple_of_16_columns_16_bytes_at_a_time() -> None:
    """Heads of 200 columns (bf16 rows of 400 bytes, 16-byte aligned but 8 mod 16 elements) take the backward's
    pointer kernels; compiled for sm_90 their widest global loads are 16 bytes (`row_align`, `_aligned`), as at 224
    columns, not the 2-4 bytes Triton issued when it knew nothing of the strides; and the forward of heads of 34 (rows
    of 68 bytes) reads 4 bytes at a time, not 2."""
    script = ROOT / "scripts" / "attention_offline_audit.py"
    done = subprocess.run(
        [sys.executable, str(script), "--dtype", "bf16", "--stored-scores", "no", "1x4x4x999x999x200",
         "1x4x4x999x999x34"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    widest = {tuple(line.split()[:2]): int(line.split()[6]) for line in done.stdout.splitlines()[1:]}
    assert widest[("1x4x4x999x999x200", "attention_bwd_dkdv_kernel")] == 16, widest
    assert widest[("1x4x4x999x999x200", "attention_bwd_dq_kernel")] == 16, widest
    assert widest[("1x4x4x999x999x34", "attention_fwd_kernel")] == 4, widest


@pytest.mark.slow
def test_attention_plan_sweep_times_every_variant_it_is_given(tmp_path) -> None:
    """scripts/attention_plan_sweep.py under the interpreter (a smoke test: no cuDNN or SDPA-flash there, each recorded
    as its error): one JSON line per shape and mask with the own plans' median and each variant's (a forced dQ plan, dS
    stored and recomputed, the head dim in one chunk), and chunkings that cannot hold the head dim left out. The forced
    plan of the recomputing dQ kernel is timed with dS recomputed: stored, that kernel would not run."""
    import json

    out = tmp_path / "sweep.jsonl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "attention_plan_sweep.py"), "--kernel", "dq", "--plans", "16x16x1x1",
         "--stored-scores", "--chunks", "32+0,16+0", "--shape", "1x2x1x20x21x24", "--shape", "1x1x1x9x7x130",
         "--rep-ms", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False, env={**os.environ, "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    row, wide = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["shape"] == [1, 2, 1, 20, 21, 24] and row["causal"] is True
    assert set(row["ms"]) == {"plan", "dq 16x16x1x1", "stored", "recomputed", "chunks32+0"}, row
    assert all(ms > 0 for ms in row["ms"].values()) and {"sdpa-cudnn", "sdpa-flash"} <= set(row["errors"]), row
    assert row["variants_store"] == {"dq 16x16x1x1": False, "stored": True, "recomputed": False, "chunks32+0": None}
    assert set(row["own_plans"]) == {"fwd", "dkdv", "dq"} and row["stores_scores"] is False, row
    # d 130 stores the scores: the own plans' dQ is the kernel of stored scores, the forced dQ plan runs recomputed
    assert set(wide["own_plans"]) == {"fwd", "dkdv", "dqds"} and wide["stores_scores"] is True, wide
    assert wide["variants_store"]["dq 16x16x1x1"] is False and "chunks32+0" not in wide["ms"], wide


def test_attention_plan_sweep_times_the_forward_alone_when_asked(tmp_path) -> None:
    """`--forward-only`: one JSON line per shape and mask of the forward's medians (own plans and a forced forward
    plan, and with `--pointers` both again by pointers: the interpreter has no TMA, so here that only shows they are
    timed), its plan alone among the own plans, nothing stored; backward variants are refused with a message."""
    import json

    out = tmp_path / "sweep.jsonl"
    script = [sys.executable, str(ROOT / "scripts" / "attention_plan_sweep.py"), "--forward-only"]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [*script, "--kernel", "fwd", "--plans", "16x16x1x1", "--pointers", "--shape", "3x2x1x19x23x40", "--causal",
         "no", "--rep-ms", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["pass"] == "forward" and row["causal"] is False and row["shape"] == [3, 2, 1, 19, 23, 40], row
    assert set(row["ms"]) == {"plan", "fwd 16x16x1x1", "pointers", "fwd 16x16x1x1 pointers"}, row
    assert all(ms > 0 for ms in row["ms"].values()), row
    assert set(row["own_plans"]) == {"fwd"} and row["stores_scores"] is False, row
    refused = subprocess.run(
        [*script, "--stored-scores", "--shape", "1x1x1x9x9x16", "--out", str(tmp_path / "no.jsonl")],
        capture_output=True, text=True, timeout=600, check=False, env=env,
    )  # fmt: skip
    assert refused.returncode == 2 and "--forward-only times the forward" in refused.stderr, refused.stderr
    assert not (tmp_path / "no.jsonl").exists()


def test_attention_plan_sweep_pointers_variant_turns_tma_off_within_its_block_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `pointers` variant runs the kernels as if no tensor were TMA-ready (the pointer kernels, on any GPU), and
    puts `tma_ready` back as it leaves, also when the block raises."""
    spec = importlib.util.spec_from_file_location("_sweep", ROOT / "scripts" / "attention_plan_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_sweep", sweep)  # its dataclasses look their module up
    spec.loader.exec_module(sweep)
    tk, original = sweep.tk, sweep.tk.tma_ready
    with sweep.running(sweep.Variant(pointers=True), 40):
        assert tk.tma_ready is not original and tk.tma_ready() is False
    assert tk.tma_ready is original
    with pytest.raises(RuntimeError), sweep.running(sweep.Variant(pointers=True), 40):
        raise RuntimeError("a variant that fails")
    assert tk.tma_ready is original
    with sweep.running(sweep.Variant(), 40):
        assert tk.tma_ready is original


def test_impl_map_reduces_a_run_and_compares_two_shape_by_shape(tmp_path) -> None:
    """scripts/impl_map.py: a bench run's JSON reduces to a map of median µs per impl (a status where an impl did not
    run), and a new run compared with the old map lists the case that got slower past the threshold, with the
    impl's ratio over torch before and after, unless it moved by less than --min-us."""
    import json

    def run(revision: str, triton_us: float) -> Path:
        records = [
            {"impl": impl, "dtype": "bfloat16", "shape": [29, 28672], "pass": "forward", "status": status,
             "median_ms": us / 1e3}
            for impl, status, us in (("torch", "ok", 10.0), ("triton", "ok", triton_us), ("liger", "error", 0.0))
        ]  # fmt: skip
        path = tmp_path / f"{revision}.json"
        path.write_text(json.dumps({"meta": {"env": {"gpu": "G", "revision": revision}}, "records": records}))
        return path

    script = str(ROOT / "scripts" / "impl_map.py")
    old_map = tmp_path / "map.json"
    done = subprocess.run([sys.executable, script, "reduce", str(run("a", 5.0)), "--out", str(old_map)], check=True)
    rows = json.loads(old_map.read_text())["rows"]
    assert done.returncode == 0 and rows == [
        {"dtype": "bfloat16", "shape": "29x28672", "pass": "forward", "torch": 10.0, "triton": 5.0, "liger": "error"}
    ]
    done = subprocess.run(
        [sys.executable, script, "compare", str(old_map), str(run("b", 6.0))],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "triton bfloat16 forward: 1 cases, 0 faster, 1 slower; /torch p95 0.500 -> 0.600" in done.stdout, done.stdout
    assert "slower 29x28672: 5.00 -> 6.00 us (1.20x)" in done.stdout, done.stdout
    done = subprocess.run(  # 1 µs more is past 20% but not past --min-us 1.5: a machine's drift, not a change
        [sys.executable, script, "compare", str(old_map), str(run("b", 6.0)), "--min-us", "1.5"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "triton bfloat16 forward: 1 cases, 0 faster, 0 slower" in done.stdout, done.stdout


def test_impl_map_keeps_cases_apart_that_differ_in_an_option_or_layout(tmp_path) -> None:
    """Two GELU cases of one shape, dtype and pass but of two forms, and a softmax case in two layouts, are four rows
    of the map (they overwrote each other when rows were keyed by dtype, shape and pass alone)."""
    import json

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import impl_map
    finally:
        sys.path.pop(0)

    def record(op: str, us: float, layout: str | None = None, **options: str) -> dict:
        case = {"op": op, "impl": "torch", "dtype": "float32", "shape": [999], "pass": "forward", **options}
        case.update({"layout": layout} if layout else {})
        key = json.dumps(case, sort_keys=True)
        return {**case, "status": "ok", "median_ms": us / 1e3, "key": key}

    run = {"records": [record("gelu", 1.0, approximate="tanh"), record("gelu", 2.0, approximate="none"),
                       record("softmax", 3.0), record("softmax", 4.0, layout="transposed")]}  # fmt: skip
    rows = {row["shape"]: row["torch"] for row in impl_map.reduce(run)}
    assert rows == {"999 approximate=tanh": 1.0, "999 approximate=none": 2.0, "999": 3.0, "999 layout=transposed": 4.0}


def gelu_naive_patch(path: Path, edit: Callable[[str], str], marks: tuple[str, ...], prefix: str = "") -> Path:
    """A patch file at `path` (git's diff form, after `prefix`) of GELU's naive impl as `edit` leaves it, each of
    `marks` once in the edited text; skips the test where bash or patch(1), which scripts/ab_trees.sh needs, is
    missing."""
    import difflib

    if shutil.which("bash") is None or shutil.which("patch") is None:
        pytest.skip("bash or patch(1) not found")
    name = "src/fuselab/ops/gelu/naive.py"
    text = (ROOT / name).read_text()
    edited = edit(text)
    assert all(edited.count(mark) == 1 for mark in marks), marks
    diff = "".join(difflib.unified_diff(text.splitlines(True), edited.splitlines(True), f"a/{name}", f"b/{name}"))
    path.write_text(f"{prefix}diff --git a/{name} b/{name}\n{diff}")
    return path


def test_ab_trees_runs_one_bench_on_two_patched_copies_of_src(tmp_path) -> None:
    """scripts/ab_trees.sh: AFTER's patch (its src/ part only: the docs/ hunk would not apply to a copy of src/) is
    applied to one copy of src/, the same bench runs on both copies, and the sleep the patch puts into GELU's naive impl
    shows as that case slower in the after run alone, its record naming its side; a second bench command after `---`
    (softmax) runs on the same copies."""
    import json
    import tarfile

    def slowed(text: str) -> str:
        text = text.replace("    check_form(approximate)\n", "    check_form(approximate)\n    time.sleep(0.003)\n", 1)
        return text.replace("import torch\n", "import time\n\nimport torch\n", 1)

    docs = "diff --git a/docs/none.md b/docs/none.md\n--- a/docs/none.md\n+++ b/docs/none.md\n@@ -1 +1 @@\n-x\n+y\n"
    slow = gelu_naive_patch(tmp_path / "slow.patch", slowed, ("time.sleep", "import time"), prefix=docs)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "BUILD": "0",
           "AFTER": str(slow), "FUSELAB_REVISION": "r1", "PYTHON": sys.executable}  # fmt: skip
    bench = ["gelu", "--device", "cpu", "--impl", "naive", "--shape", "999", "--dtype", "fp32"]
    bench += ["--opt", "approximate=tanh", "--rep-ms", "20", "--warmup-ms", "1", "--rounds", "1"]
    bench += ["--call-cost-ms", "0", "---", "softmax", "--device", "cpu", "--impl", "torch", "--shape", "3x5"]
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ab_trees.sh"), *bench], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "before: 0 patch files applied" in done.stdout and "after: 1 patch files applied" in done.stdout
    assert "after-1: rc 1" in done.stdout and "slower 999 approximate=tanh:" in done.stdout, done.stdout
    assert "== command 2: fuselab bench softmax" in done.stdout, done.stdout
    with tarfile.open(tmp_path / "out" / "ab.tgz") as archive:
        names = ("before-1", "after-1", "before-2", "after-2")
        results = {name: json.load(archive.extractfile(f"./{name}.json")) for name in names}
    runs = {name: result["records"] for name, result in results.items()}
    for name, records in runs.items():
        assert records and all(r["status"] == "ok" for r in records), records
        assert results[name]["meta"]["env"]["revision"] == f"r1+{name[:-2]}"
    (before,), (after,) = runs["before-1"], runs["after-1"]
    assert before["impl"] == "naive" and before["median_ms"] < 1.0 <= 3.0 <= after["median_ms"], runs
    assert {r["op"] for r in runs["after-2"]} == {"softmax"}
    assert "time.sleep" not in (ROOT / "src/fuselab/ops/gelu/naive.py").read_text()  # the tree itself untouched


def test_ab_trees_checks_tell_a_failure_the_patches_brought(tmp_path) -> None:
    """scripts/ab_trees.sh with CHECKS and no bench: `fuselab check` runs on the after tree, and where it fails (a patch
    that makes GELU's naive impl 1% off), on the before tree too, whose pass says the failure is the patches'."""
    import json
    import tarfile

    def off(text: str) -> str:
        return text.replace("0.5 * x * (1.0 + torch.tanh(", "1.01 * 0.5 * x * (1.0 + torch.tanh(", 1)

    wrong = gelu_naive_patch(tmp_path / "wrong.patch", off, ("1.01 * ",))
    checks = "gelu --device cpu --impl naive --dtype fp32 --opt approximate=tanh;\n softmax --device cpu\n --impl naive"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "BUILD": "0",
           "AFTER": str(wrong), "PYTHON": sys.executable, "CHECKS": f"{checks} --dtype fp32"}  # fmt: skip
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ab_trees.sh")], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "== check 1: fuselab check gelu" in done.stdout and "after rc 1" in done.stdout, done.stdout
    assert "before rc 0 (0: the failure is the patches')" in done.stdout, done.stdout
    assert "== check 2: fuselab check softmax --device cpu --impl naive --dtype fp32: after rc 0" in done.stdout, (
        done.stdout[-3000:]
    )
    with tarfile.open(tmp_path / "out" / "ab.tgz") as archive:
        found = {name: json.load(archive.extractfile(f"./{name}.json")) for name in ("check-after-1", "check-before-1")}
    after, before = (found[name]["records"] for name in ("check-after-1", "check-before-1"))
    assert after and before
    assert any(r["status"] == "FAIL" for r in after) and all(r["status"] == "pass" for r in before), (after, before)


def test_gpt_blocks_kernel_gaps_rank_the_kernels_by_their_difference_a_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/gpt_blocks.py --kernels: the lines name the two models' GPU µs a step, then the kernels whose time a
    step differs most between them, largest first, a kernel only one model runs counted as 0 in the other."""
    monkeypatch.setattr(sys, "argv", ["gpt_blocks.py"])
    spec = importlib.util.spec_from_file_location("_bench_gpt_blocks", ROOT / "benchmarks" / "gpt_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernels = {
        "fuselab compiled": {"ours_fwd": (4.0, 200.0), "gemm": (8.0, 500.0), "copy": (4.0, 28.0)},
        "torch.nn compiled": {"cudnn_fwd": (4.0, 185.0), "gemm": (8.0, 503.0)},
    }
    lines = module.kernel_gaps(kernels, "compiled", top=3)
    assert lines[0].startswith("compiled: GPU µs a step, fuselab 728.0, torch.nn 688.0")
    assert [line.split()[-1] for line in lines[1:]] == ["ours_fwd", "cudnn_fwd", "copy"]
    assert lines[1].split()[0] == "+200.0" and lines[2].split()[0] == "-185.0"


def test_ext_cache_keeps_builds_made_from_the_same_sources_and_only_those(tmp_path) -> None:
    """scripts/ext_cache.sh: an archive of builds unpacked into a tree whose C sources were written after them (as a
    device call's copy is) needs no rebuild where they are the sources it was built from, and a rebuild of what
    changed where one differs; a build left out of date is packed without the stamp, so it is never kept."""
    ninja = shutil.which("ninja")
    if ninja is None:
        pytest.skip("ninja not found")
    src, ext = tmp_path / "src", tmp_path / "cache" / "ext"
    (src / "op").mkdir(parents=True)
    (src / "op" / "k.cu").write_text("int k;\n")
    (src / "op" / "plan.h").write_text("int plan;\n")
    (ext / "op").mkdir(parents=True)
    rule = "rule cat\n  command = cat $in > $out\n"
    (ext / "op" / "build.ninja").write_text(f"{rule}build k.o: cat {src}/op/k.cu {src}/op/plan.h\n")
    env = {**os.environ, "FUSELAB_EXT_DIR": str(ext), "SRC": str(src)}

    def cache(*args: str) -> str:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "ext_cache.sh"), *args], env=env, capture_output=True,
                              text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def up_to_date() -> bool:
        dry = subprocess.run([ninja, "-C", str(ext / "op"), "-n"], capture_output=True, text=True, check=True)
        return "no work to do" in dry.stdout

    def rewrite(path: Path, text: str) -> None:  # a later time than any build: the device's copy of the tree
        path.write_text(text)
        os.utime(path, (time.time() + 5, time.time() + 5))

    subprocess.run([ninja, "-C", str(ext / "op")], capture_output=True, check=True)
    archive = str(tmp_path / "ext.tgz")
    cache("pack", archive)
    for name in ("k.cu", "plan.h"):
        rewrite(src / "op" / name, (src / "op" / name).read_text())
    shutil.rmtree(ext)
    assert "kept" in cache("unpack", archive) and up_to_date()
    rewrite(src / "op" / "plan.h", "int plan = 2;\n")  # another header: rebuilt
    shutil.rmtree(ext)
    assert "rebuilds" in cache("unpack", archive) and not up_to_date()
    assert "not stamped" in cache("pack", archive)  # out of date when packed: never kept
    shutil.rmtree(ext)
    assert "rebuilds" in cache("unpack", archive) and not up_to_date()
