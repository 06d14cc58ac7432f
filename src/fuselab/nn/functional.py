"""fuselab.nn.functional: the functions each op exposes (`Op.functional`), found by discovery, e.g.
`fuselab.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)` (impl="auto": the fused kernels on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable

from fuselab.ops.registry import all_ops


def functions() -> dict[str, Callable]:
    """{name: function} of every registered op's functional entry points."""
    return {name: fn for op in all_ops() for name, fn in op.functional.items()}


def __getattr__(name: str) -> Callable:
    found = functions()
    if name in found:
        return found[name]
    raise AttributeError(f"fuselab.nn.functional has no {name!r}; functions: {', '.join(sorted(found)) or 'none'}")


def __dir__() -> list[str]:
    return sorted(functions())
