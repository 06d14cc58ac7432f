"""The layering holds: no package imports one on a floor above it (scripts/draw_architecture.py reads the imports)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_drawing():
    spec = importlib.util.spec_from_file_location("draw_architecture", ROOT / "scripts" / "draw_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_import_goes_up_a_floor() -> None:
    drawing = load_drawing()
    counts = drawing.edges()
    assert counts[("ops/<op>", "ops")] > 0 and counts[("cli", "ops")] > 0  # it reads the imports at all
    up = [(a, b) for (a, b) in counts if drawing.FLOORS_INDEX[b] > drawing.FLOORS_INDEX[a]]
    assert up == []
    assert ("bench", "ops") not in counts and ("ops", "ops/<op>") not in counts  # the harness knows no op


def test_every_package_is_on_a_floor() -> None:
    drawing = load_drawing()
    packages = {p.name for p in (ROOT / "src" / "fuselab").iterdir() if p.is_dir() and not p.name.startswith("_")}
    packages |= {p.stem for p in (ROOT / "src" / "fuselab").glob("*.py") if not p.stem.startswith("_")}
    assert packages <= set(drawing.FLOORS_INDEX)
