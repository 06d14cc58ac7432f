"""Drop-in modules backed by fuselab's kernels, one per op that declares one (`Op.module`), found by discovery:
`fuselab.nn.GELU()` (impl="auto": the fused kernel on a GPU),
`fuselab.nn.Softmax(dim=-1, impl="cuda")`, ... and `fuselab.nn.functional`.
"""

from __future__ import annotations

import importlib

from fuselab.ops.registry import all_ops


def modules() -> dict[str, type]:
    """{class name: module class} of every registered op that has one."""
    return {op.module.__name__: op.module for op in all_ops() if op.module is not None}


def __getattr__(name: str) -> object:
    if name == "functional":  # import_module: `from fuselab.nn import functional` here would ask this hook again
        return importlib.import_module("fuselab.nn.functional")
    found = modules()
    if name in found:
        return found[name]
    raise AttributeError(f"fuselab.nn has no {name!r}; modules: {', '.join(sorted(found)) or 'none'}")


def __dir__() -> list[str]:
    return sorted([*modules(), "functional", "modules"])
