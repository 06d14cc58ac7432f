"""Named ranges that show in every profiler we use: Nsight Systems (NVTX) and torch.profiler alike.

    with fuselab.profile.range("forward"):
        y = model(x)

    @fuselab.profile.range("step")
    def step(): ...

In a torch.profiler trace a range is a `user_annotation` event (and a `gpu_user_annotation` over the kernels
it launched); under `nsys profile` it is an NVTX range. Without a GPU only the torch.profiler half is used.
"""

from __future__ import annotations

import contextlib
from types import TracebackType

import torch
from torch.profiler import record_function

__all__ = ["range"]


def _nvtx_usable() -> bool:
    # torch.cuda.nvtx raises on CPU-only builds; on a CUDA build without nsys attached the calls are cheap no-ops.
    return torch.cuda.is_available()


class range(contextlib.ContextDecorator):  # shadows the builtin on purpose: fuselab.profile.range
    """Mark a region named `name` for Nsight Systems (NVTX push/pop) and torch.profiler (record_function).

    Usable as a context manager and as a decorator; re-entrant (a decorated function may recurse).
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a range needs a non-empty name (str), got {name!r}")
        self.name = name
        self._open: list[record_function] = []

    def __enter__(self) -> range:
        if _nvtx_usable():
            torch.cuda.nvtx.range_push(self.name)
        rf = record_function(self.name)
        rf.__enter__()
        self._open.append(rf)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._open.pop().__exit__(exc_type, exc, tb)
        if _nvtx_usable():
            torch.cuda.nvtx.range_pop()
