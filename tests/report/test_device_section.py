"""The report's device section: the ceilings every rate is set against, and whether they can be trusted."""

import json

from fuselab.bench import ceilings
from fuselab.report import run_full_report


def test_the_device_section_says_when_the_ceilings_were_measured_on_a_busy_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSELAB_CACHE", str(tmp_path / "cache"))
    measured = ceilings.measure_ceilings("cpu", quick=True)
    busy = {**measured, "quick": False, "cpu_busy": 0.6}  # as if timed beside other work
    path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(busy))
    run_full_report(tmp_path / "out", device="cpu", quick=True, only=["device"], show_progress=False)
    md = " ".join((tmp_path / "out" / "report.md").read_text().split())
    assert "ceilings were measured while the CPU was busy (some task waited for a CPU 60% of the time)" in md
