"""What the CLI's tests share: the repository's root and the shape of a one-line error."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
