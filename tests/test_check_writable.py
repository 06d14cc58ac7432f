"""`check_writable`: the up-front check that an output path can be written, also when ranks check it at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fuselab.cli._args import check_writable


def test_many_checkers_of_one_path_at_once_all_pass_and_leave_nothing(tmp_path: Path):
    out = tmp_path / "new" / "s.json"
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: check_writable(out), range(400)))  # raises if one probe removed another's
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_folder_or_an_unwritable_place_is_refused(tmp_path: Path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError, match="it is a folder"):
        check_writable(tmp_path / "d")
    with pytest.raises(OSError, match="cannot write"):
        check_writable(Path("/proc/fuselab-probe/s.json"))
