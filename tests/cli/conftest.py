"""The CLI's tests run the real command in a subprocess, as a user does, against a cache folder of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from clirun import ROOT  # tests/cli/clirun.py (pytest puts this folder on sys.path)


@pytest.fixture
def fuselab(cache: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """fuselab(*args, cwd=None, env=None): `python -m fuselab ARGS` in tmp_path (or cwd), its output captured."""

    def run(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        environ = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "FUSELAB_CACHE": str(cache), **(env or {})}
        environ.pop("FUSELAB_DEBUG", None)
        return subprocess.run([sys.executable, "-m", "fuselab", *args], capture_output=True, text=True, env=environ,
                              timeout=120, cwd=cwd or tmp_path)  # fmt: skip

    return run
