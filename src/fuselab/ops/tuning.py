"""Tuning as data: an op's plan parameters per GPU, as JSON files in the op's folder (knows no op).

A table holds the parameters of an op's launch *rules* (tile bytes, warps per element size, thresholds), never plans
looked up by a tuned shape, so it applies to every shape. Files are `<op folder>/plans/<device key>.json`, the key
naming the GPU and its compute capability (`nvidia-h200-sm90`). A launcher reads its op's defaults (the rule's
parameters for a GPU never tuned) overridden by the table of the GPU it runs on, if any; `fuselab tune OP` writes
the tables.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch

TABLE_VERSION = 1


def device_key(index: int | None = None) -> str:
    """'<device name>-sm<major><minor>' of CUDA device `index` (default: the current one), lower case, dashes:
    'nvidia-h200-sm90'."""
    index = torch.cuda.current_device() if index is None else index
    return _device_key(index)


@functools.cache
def _device_key(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    return key_of(props.name, props.major, props.minor)


def key_of(name: str, major: int, minor: int) -> str:
    """The table key of a GPU named `name` with compute capability major.minor."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return f"{slug}-sm{major}{minor}"


def table_path(folder: Path, key: str) -> Path:
    return Path(folder) / "plans" / f"{key}.json"


@functools.cache
def load_table(folder: Path, key: str | None) -> dict:
    """The parameters tuned for GPU `key` in `folder`/plans, or {} (no table: the op's defaults hold)."""
    if key is None:
        return {}
    path = table_path(folder, key)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    if data.get("version") != TABLE_VERSION:
        raise ValueError(f"{path}: plan table version {data.get('version')!r}, this fuselab reads {TABLE_VERSION}")
    return data.get("params", {})


def params(defaults: Mapping[str, object], folder: Path, key: str | None) -> dict:
    """`defaults` with the tuned values for GPU `key` laid over them (unknown names in the table are errors)."""
    tuned = load_table(Path(folder), key)
    unknown = set(tuned) - set(defaults)
    if unknown:
        raise ValueError(f"plan table for {key} in {folder}: unknown parameters {sorted(unknown)}")
    return {**defaults, **tuned}


def write_table(folder: Path, key: str, values: Mapping[str, object], evidence: Mapping[str, object]) -> Path:
    """Write (or replace) the table of GPU `key`: `values` (parameters), `evidence` (what the tuner timed)."""
    path = table_path(folder, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": TABLE_VERSION, "device": key, "params": dict(values), "evidence": dict(evidence)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    load_table.cache_clear()
    return path
