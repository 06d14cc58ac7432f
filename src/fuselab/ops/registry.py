"""The op registry: an op is described once, its implementations register against it.

An :class:`Op` holds everything every tool needs (a float64 reference, an input maker, a cost model,
tolerances); an :class:`Impl` is one way of computing it. Tools (check, bench, profile, report) take any op
and any impl from here and never special-case one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

Shape = tuple[int, ...]
InputMaker = Callable[[Shape, torch.dtype, str, int], tuple[torch.Tensor, ...]]

_REGISTRY: dict[str, Op] = {}


class UnknownName(KeyError):
    """An op or impl name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


@dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    fn: takes the op's inputs (and its options as keywords) and returns the output.
    devices: the device types it runs on ("cpu", "cuda").
    requires(device_type): None when usable on that device here, else the reason it is not (no Triton, no nvcc).
    compiled: fn is to be wrapped by torch.compile per case (the harness reports compile time apart).
    backward: fn supports autograd (gradients are checked against the reference).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    devices: tuple[str, ...] = ("cpu", "cuda")
    requires: Callable[[str], str | None] | None = None
    compiled: bool = False
    backward: bool = False
    doc: str = ""

    def unavailable(self, device: str | torch.device) -> str | None:
        """Why this impl cannot run on `device` here, or None when it can."""
        kind = torch.device(device).type
        if kind not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)} only, not on {kind}"
        if kind == "cuda" and not torch.cuda.is_available():
            return "no CUDA GPU in this process"
        return self.requires(kind) if self.requires else None

    def __call__(self, *inputs: torch.Tensor, **options: object) -> torch.Tensor:
        return self.fn(*inputs, **options)


@dataclass
class Op:
    """An operation described once.

    reference: float64 implementation, inputs already float64 (any device).
    make_inputs(shape, dtype, device, seed): fresh random inputs (never zeros).
    bytes_moved(shape, dtype): the fewest bytes a fused kernel must read + write.
    flops(shape): floating-point operations of one call.
    tolerance: max relative error ||out - ref|| / ||ref|| per dtype.
    options: keyword options the impls accept, each with its allowed values, the first the default.
    check_shapes / bench_shapes: defaults for `fuselab check` and `fuselab bench`.
    baseline: the impl speed-ups are quoted against.
    random_shape(rng): a shape drawn with a numpy Generator, for `bench --shapes random:N` (fuselab.bench.shapes);
    None: the op has no random draw.
    """

    name: str
    reference: Callable[..., torch.Tensor]
    make_inputs: InputMaker
    bytes_moved: Callable[[Shape, torch.dtype], int]
    flops: Callable[[Shape], int]
    tolerance: dict[torch.dtype, float]
    check_shapes: Sequence[Shape]
    bench_shapes: Sequence[Shape]
    options: dict[str, tuple] = field(default_factory=dict)
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    baseline: str = "torch"
    doc: str = ""
    random_shape: Callable[[object], Shape] | None = None
    impls: dict[str, Impl] = field(default_factory=dict)

    def impl(self, name: str, **kwargs: object) -> Callable[[Callable], Callable]:
        """Decorator registering `fn` as implementation `name` (keywords as in :class:`Impl`)."""

        def register(fn: Callable) -> Callable:
            if name in self.impls:
                raise ValueError(f"op {self.name!r} already has an impl named {name!r}")
            self.impls[name] = Impl(name=name, fn=fn, doc=(fn.__doc__ or "").strip(), **kwargs)
            return fn

        return register

    def get_impl(self, name: str) -> Impl:
        if name not in self.impls:
            raise UnknownName(f"op {self.name!r} has no impl {name!r}; known: {', '.join(self.impls)}")
        return self.impls[name]

    def default_options(self) -> dict[str, object]:
        return {key: values[0] for key, values in self.options.items()}

    def resolve_options(self, given: dict[str, object] | None) -> dict[str, object]:
        """The default options overridden by `given`; unknown keys or values raise ValueError."""
        resolved = self.default_options()
        for key, value in (given or {}).items():
            if key not in self.options:
                raise ValueError(f"op {self.name!r} has no option {key!r}; options: {list(self.options) or 'none'}")
            if value not in self.options[key]:
                raise ValueError(f"option {key}={value!r} not accepted by {self.name!r}; accepted: {self.options[key]}")
            resolved[key] = value
        return resolved


def register_op(op: Op) -> Op:
    if op.name in _REGISTRY:
        raise ValueError(f"an op named {op.name!r} is already registered")
    _REGISTRY[op.name] = op
    return op


def get_op(name: str) -> Op:
    _load_builtin_ops()
    if name not in _REGISTRY:
        raise UnknownName(f"unknown op {name!r}; known ops: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]


def all_ops() -> list[Op]:
    _load_builtin_ops()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def _load_builtin_ops() -> None:
    import fuselab.ops  # noqa: F401  (importing the package registers gelu, softmax, ...)


_POWER = re.compile(r"^(\d+)\^(\d+)$")


def parse_shape(text: str) -> Shape:
    """'2^24' -> (16777216,), '4096x2^10' -> (4096, 1024), '' or 'scalar' -> ()."""
    text = text.strip().lower()
    if text in ("", "scalar", "()"):
        return ()
    dims = []
    for part in text.split("x"):
        part = part.strip()
        match = _POWER.match(part)
        try:
            dim = int(match.group(1)) ** int(match.group(2)) if match else int(part)
        except ValueError:
            raise ValueError(f"bad shape {text!r}: each dimension is an integer or B^E, joined by 'x'") from None
        if dim < 0:
            raise ValueError(f"bad shape {text!r}: dimensions must be >= 0")
        dims.append(dim)
    return tuple(dims)


def format_shape(shape: Shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"
