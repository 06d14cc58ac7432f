"""What the CLI's tests share: the repository's root, how a command is run, and the shape of a one-line error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def runner(cache: Path, folder: Path) -> Callable[..., subprocess.CompletedProcess]:
    """run(*args, cwd=None, env=None): `python -m fuselab ARGS` in `folder` (or cwd) against `cache`, its output
    captured (the `fuselab` fixture's; tests/cli/conftest.py)."""

    def run(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        environ = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FUSELAB_CACHE": str(cache), **(env or {})}
        environ.pop("FUSELAB_DEBUG", None)
        return subprocess.run([sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=environ,
                              timeout=120, cwd=cwd or folder)  # fmt: skip

    return run


def one_line_error(out: subprocess.CompletedProcess, command: str, *messages: str) -> str:
    """The one line on stderr, `fuselab COMMAND: error: ...`, holding each of `messages`; exit status 2."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"fuselab {command}: error: "), out.stderr
    for message in messages:
        assert message in lines[0], out.stderr
    return lines[0]
