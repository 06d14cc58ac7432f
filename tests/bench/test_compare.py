"""`fuselab compare` on the CPU: a real tiny sweep's log against itself spread over two ranks, and against a log with a
case measured twice and another won by a different impl."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fuselab(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FUSELAB_CACHE": str(cache)}
    return subprocess.run(
        [sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=env, timeout=300
    )


def write_log(path: Path, rows: list[dict]) -> Path:
    path.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_compare_a_real_sweep_with_its_rows_spread_over_two_ranks(tmp_path, cache):
    one = tmp_path / "one.json"
    bench = ["bench", "gelu", "--impl", "torch,naive", "--shape", "1000", "--shape", "3000", "--dtype", "fp32"]
    bench += ["--opt", "approximate=tanh"]
    out = fuselab(*bench, "--rep-ms", "2", "--warmup-ms", "1", "--call-cost-ms", "0", "--out", str(one), cache=cache)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in one.with_suffix(".jsonl").read_text().splitlines()]
    assert len(rows) == 4
    many = write_log(
        tmp_path / "many.json", [{**r, "rank": i % 2, "host": "h", "gpu_index": i % 2} for i, r in enumerate(rows)]
    )

    walls = "one=10,one_resume=2,many=6,many_resume=2"
    out = fuselab("compare", str(one), str(many), "--walls", walls, "--out", str(tmp_path / "c.json"), cache=cache)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["cases"] == 4 and result["every_case_once"]
    assert result["rows_per_rank"] == {"0": 2, "1": 2} and result["gpus"] == ["h:0", "h:1"]
    assert result["winners_agree"] == 2 and result["winners_differ"] == []  # the same rows: the same winners
    assert result["speedup_wall"] == 10 / 6 and result["speedup_sweep"] == 8 / 4
    assert "cases: 4, every case once in each log: yes" in out.stdout and "speed-up, wall: 1.67x" in out.stdout

    # the N-GPU log measured the 3000-element case of one impl twice, and the other impl won the 1000-element case
    first = [r for r in rows if r["shape"] == [1000]]
    winner, loser = sorted(first, key=lambda r: r["median_ms"])
    slowed = {**winner, "median_ms": loser["median_ms"] * 100}
    swapped = [slowed if r is winner else r for r in rows] + [rows[-1]]
    broken = write_log(tmp_path / "broken.json", swapped)
    out = fuselab("compare", str(one), str(broken), cache=cache)
    assert out.returncode == 1
    assert "every case once in each log: NO" in out.stdout
    assert "1 differ" in out.stdout and '"shape": [1000]' in out.stdout


def test_compare_says_which_log_is_missing_in_one_line(tmp_path):
    out = fuselab("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), cache=tmp_path)
    assert out.returncode == 2 and f"no log {tmp_path / 'a.jsonl'}" in out.stderr and "Traceback" not in out.stderr


def test_compare_refuses_an_unknown_wall(tmp_path):
    for name in ("a", "b"):
        write_log(tmp_path / f"{name}.json", [])
    out = fuselab("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--walls", "2gpu=4", cache=tmp_path)
    assert out.returncode == 2 and "--walls takes NAME=SECONDS" in out.stderr
