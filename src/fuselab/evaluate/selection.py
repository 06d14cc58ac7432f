"""`Selection`: what of an op a check or bench runs (impls, dtypes, shapes, options, device, layouts), built once where
the request is made (the command line, the report's plan, the gate) and resolved against the op's defaults here."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from fuselab.bench.dtypes import dtype_name, parse_dtype
from fuselab.bench.record import CONTIGUOUS
from fuselab.bench.shapes import LAYOUTS
from fuselab.ops.registry import Op, Shape

BENCH_DTYPES = (torch.float32, torch.bfloat16)  # what a bench times when no dtype is given
Purpose = Literal["check", "bench"]


@dataclass(frozen=True)
class Selection:
    """What to run of an op. None (or empty) in impls, dtypes, shapes: the op's, filled by `resolved`; options None:
    every combination of the op's options (`option_grid`), else those values; device None: the GPU if any; layouts:
    the inputs' memory layouts (bench.shapes.LAYOUTS; a name or several), every case run in each.

    Sequences are kept as tuples; dtypes may be given by name ("bf16")."""

    impls: Sequence[str] | None = None
    dtypes: Sequence[torch.dtype | str] | None = None
    shapes: Sequence[Shape] | None = None
    options: Mapping[str, object] | None = None
    device: str | None = None
    layouts: Sequence[str] = (CONTIGUOUS,)

    def __post_init__(self) -> None:
        dtypes = None if self.dtypes is None else tuple(parse_dtype(d) for d in self.dtypes)
        shapes = None if self.shapes is None else tuple(tuple(int(n) for n in s) for s in self.shapes)
        object.__setattr__(self, "impls", None if self.impls is None else tuple(self.impls))
        object.__setattr__(self, "dtypes", dtypes)
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "options", None if self.options is None else dict(self.options))
        object.__setattr__(self, "device", self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        layouts = (self.layouts,) if isinstance(self.layouts, str) else tuple(dict.fromkeys(self.layouts))
        unknown = [name for name in layouts if name not in LAYOUTS]
        if unknown or not layouts:
            raise ValueError(f"unknown layout {unknown or list(layouts)}; accepted: {', '.join(LAYOUTS)}")
        object.__setattr__(self, "layouts", layouts)

    def checked(self, op: Op) -> Selection:
        """This selection, once its impls are known to `op` (UnknownName listing the known ones) and its dtypes
        declared by it (ValueError listing those it declares)."""
        _known(op, self.impls or ())
        for dtype in self.dtypes or ():
            if dtype not in op.dtypes:
                accepted = ", ".join(dtype_name(d) for d in op.dtypes)
                raise ValueError(f"{op.name} does not take {dtype_name(dtype)}; accepted: {accepted}")
        return self

    def resolved(self, op: Op, purpose: Purpose) -> Selection:
        """Impls, dtypes and shapes filled for a `purpose` run of `op`: all its impls (named ones checked:
        UnknownName listing the known), its check or bench shapes, and a check's op.dtypes or a bench's BENCH_DTYPES."""
        if purpose not in ("check", "bench"):
            raise ValueError(f"unknown purpose {purpose!r}; accepted: check, bench")
        impls = _known(op, self.impls or tuple(op.impls))
        check = purpose == "check"
        dtypes = self.dtypes or (op.dtypes if check else BENCH_DTYPES)
        shapes = self.shapes or (op.defaults.check_shapes if check else op.defaults.bench_shapes)
        return dataclasses.replace(self, impls=impls, dtypes=dtypes, shapes=shapes)


def _known(op: Op, impls: tuple[str, ...]) -> tuple[str, ...]:
    """`impls`, once each is known to `op` (UnknownName listing the known ones otherwise)."""
    for name in impls:
        op.get_impl(name)
    return impls
