"""Small things a new user notices (issue 24), each tried as the user would: `--impl ,` refused by every command
that takes impls, and the README's `mymodule.py` is what `bench mymodule:my_fn` runs (a module not found is a one-line
error: test_newcomer_cli.py)."""

from __future__ import annotations

import re

import pytest
from clirun import ROOT  # tests/cli/clirun.py

from fuselab.cli import main


@pytest.mark.parametrize("command", ["check", "bench", "profile", "inspect"])
def test_an_impl_list_naming_nothing_is_refused(command, capsys):
    assert main([command, "gelu", "--impl", ","]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fuselab {command}: error: ',' names nothing; give names separated by commas"]


def test_the_readme_shows_the_mymodule_that_its_bench_line_runs(fuselab, tmp_path):
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("fuselab bench mymodule:my_fn"))
    nargs = re.search(r"--nargs (\d+)", line).group(1)
    block = re.search(r"```python\n# mymodule\.py\n(.*?)```", readme, re.S)
    assert block, "the README shows no mymodule.py"
    (tmp_path / "mymodule.py").write_text(block.group(1))
    out = fuselab("check", "mymodule:my_fn", "--nargs", nargs, "--shape", "33x7", "--dtype", "fp32", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "1 passed, 0 failed" in out.stdout
