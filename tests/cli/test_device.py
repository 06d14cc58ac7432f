"""`fuselab device` as a user reads it: the ceilings, and whether they can be trusted."""

import json

from fuselab.bench import ceilings
from fuselab.cli import main


def test_device_says_when_the_ceilings_were_measured_on_a_busy_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    measured = ceilings.measure_ceilings("cpu", quick=True)
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**measured, "quick": False, "cpu_busy": 0.6}))  # as if timed beside other work
    assert main(["device", "--device", "cpu"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "copy bandwidth" in out
    assert "ceilings were measured while the CPU was busy (some task waited for a CPU 60% of the time)" in out
