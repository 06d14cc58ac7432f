"""The CLI's tests run the real command in a subprocess, as a user does, against a cache folder of their own."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from clirun import runner  # tests/cli/clirun.py (pytest puts this folder on sys.path)


@pytest.fixture
def fuselab(cache: Path, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """fuselab(*args, cwd=None, env=None): `python -m fuselab ARGS` in tmp_path (or cwd), its output captured."""
    return runner(cache, tmp_path)
