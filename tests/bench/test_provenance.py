"""Every results file says what measured it: the git revision (and whether the tree was dirty), host, threads, time."""

from __future__ import annotations

import datetime
import re
import subprocess

import torch

from fuselab.bench.env import ROOT, provenance


def test_provenance_names_the_revision_host_threads_and_time(monkeypatch) -> None:
    monkeypatch.delenv("FUSELAB_REVISION", raising=False)
    p = provenance("cpu")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:  # a checkout: git's own answer
        assert p["revision"] == head.stdout.strip() and isinstance(p["dirty"], bool)
    else:
        assert p["revision"] == "unknown"
    assert p["threads"] == torch.get_num_threads() and p["host"] and p["torch"] == torch.__version__
    assert datetime.datetime.fromisoformat(p["written"]).tzinfo is not None
    monkeypatch.setenv("FUSELAB_REVISION", "abc1234")  # a copy without .git, as on the GPU machine
    q = provenance("cpu")
    assert q["revision"] == "abc1234" and q["dirty"] is None
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", q["fuselab"])
