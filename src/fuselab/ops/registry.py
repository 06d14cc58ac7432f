"""The op registry: an op is described once, its implementations register against it.

An :class:`Op` holds everything every tool needs (a float64 reference, named inputs, typed options, a cost model and
the bound it implies, tolerances, the shapes each tool starts from, its nn module and report prose); an
:class:`Impl` is one way of computing it. Tools (check, bench, profile, inspect, report) take any op and any impl
from here and never special-case one. Registration is discovery: every package under ``fuselab/ops/`` that calls
:func:`register_op` when imported is found by :func:`all_ops` (see :func:`discover`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import pkgutil
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Literal

import torch
from torch.compiler import is_compiling

from fuselab.bench.dtypes import dtype_name
from fuselab.ops.backends import InputSpec, checked_inputs

Shape = tuple[int, ...]
# make_inputs(shape, dtype, device, seed, **options) -> the op's input tensors, in the order of Op.inputs
InputMaker = Callable[..., tuple[torch.Tensor, ...]]
Bound = Literal["memory", "compute"]
MODES = ("quick", "cpu", "gpu")

_REGISTRY: dict[str, Op] = {}


class UnknownName(KeyError):
    """An op or impl name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0])


@dataclass(frozen=True)
class Option:
    """A typed keyword option of an op: its type is the default's (str, bool, int or float).

    choices: the accepted values (the first is not necessarily the default); empty: any value of the type.
    check and bench sweep every choice when the user names none; options without choices keep their default.
    """

    name: str
    default: str | bool | int | float
    choices: tuple = ()
    doc: str = ""

    def __post_init__(self) -> None:
        if self.choices and self.default not in self.choices:
            raise ValueError(f"option {self.name}: default {self.default!r} is not among {self.choices}")

    @property
    def kind(self) -> type:
        return type(self.default)

    @property
    def sweep(self) -> tuple:
        """The values a sweep that names none visits."""
        return self.choices or (self.default,)

    def parse(self, text: str | bool | int | float) -> str | bool | int | float:
        """`text` (from the command line, or already typed) as this option's type; ValueError when not accepted."""
        value: object = text
        if isinstance(text, str) and self.kind is not str:
            word = text.strip().lower()
            try:
                if self.kind is bool:
                    if word not in ("true", "false", "1", "0", "yes", "no"):
                        raise ValueError(word)
                    value = word in ("true", "1", "yes")
                else:
                    value = self.kind(word)
            except ValueError:
                raise ValueError(f"option {self.name}={text!r} is not a {self.kind.__name__}") from None
        elif self.kind is float and isinstance(text, int) and not isinstance(text, bool):
            value = float(text)
        if not isinstance(value, self.kind) or (self.kind is int and isinstance(value, bool)):
            raise ValueError(f"option {self.name}={text!r} is not a {self.kind.__name__}")
        if self.choices and value not in self.choices:
            raise ValueError(
                f"option {self.name}={value!r} is not accepted; accepted: {', '.join(map(str, self.choices))}"
            )
        return value


@dataclass(frozen=True)
class Impl:
    """One implementation of an op.

    fn: takes the op's inputs (and its options as keywords) and returns the output; registered through
        :meth:`Op.impl`, it refuses first the inputs that `devices`, `dtypes` and `min_dim` do not accept.
    devices: the device types it runs on ("cpu", "cuda").
    requires(device_type): None when usable on that device here, else the reason it is not (no Triton, no nvcc).
    compiled: fn is to be wrapped by torch.compile per case (the harness reports compile time apart).
    backward: fn supports autograd (gradients are checked against the reference).
    triton_kernels: returns the @triton.jit functions the impl launches (what `inspect` compiles and shows).
    cuda_source: the .cu file of its CUDA C++ kernels (what `inspect` compiles and shows).
    dtypes: the dtypes it accepts, when not its op's (None: every dtype of the op); e.g. fewer (FlashAttention:
        fp16/bf16), or float64 too (PyTorch's own functions).
    min_dim: the fewest dimensions each input must have (attention: 3, (batch, N, d)).
    upstream: it runs another project's kernels (a baseline: torch's function, SDPA, torch.compile's code; a rival:
        Liger-Kernel's), so what fails in it is that project's to fix: the GPU gate reports such failures apart from
        fuselab's own.
    tolerance_scale: it is held to its op's tolerance times this: an unfused chain of k ops rounds k times in a
        16-bit dtype where a fused kernel rounds once (say why where it is set).
    """

    name: str
    fn: Callable[..., torch.Tensor]
    devices: tuple[str, ...] = ("cpu", "cuda")
    requires: Callable[[str], str | None] | None = None
    compiled: bool = False
    backward: bool = False
    doc: str = ""
    triton_kernels: Callable[[], Sequence[object]] | None = None
    cuda_source: Path | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    min_dim: int = 0
    upstream: bool = False
    tolerance_scale: float = 1.0

    @property
    def inspectable(self) -> bool:
        return self.triton_kernels is not None or self.cuda_source is not None

    def unavailable(self, device: str | torch.device, dtype: torch.dtype | None = None) -> str | None:
        """Why this impl cannot run on `device` (in `dtype`, when given) here, or None when it can."""
        kind = torch.device(device).type
        if kind not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)} only, not on {kind}"
        if dtype is not None and self.dtypes is not None and dtype not in self.dtypes:
            names = ", ".join(dtype_name(d) for d in self.dtypes)
            return f"{self.name} computes in {names} only, not {dtype_name(dtype)}"
        if kind == "cuda" and not torch.cuda.is_available():
            return "no CUDA GPU in this process"
        return self.requires(kind) if self.requires else None

    def __call__(self, *inputs: torch.Tensor, **options: object) -> torch.Tensor:
        return self.fn(*inputs, **options)


@dataclass(frozen=True)
class Defaults:
    """What the tools measure of an op when told nothing else: data beside the op's math, in its folder's spec.py.

    check_shapes / bench_shapes / profile_shape: defaults for `fuselab check`, `bench`, `profile` and `inspect`.
    large_shape: a shape past 2^31 elements that the GPU gate checks (forward: 64-bit offsets), or None.
    random_shape(rng): one shape drawn for `bench --shapes random:N` (numpy Generator), or None.
    axis: (label, shape -> value) the plots of its speed run along (default: the element count, or the last
        dimension where the count is fixed); panel(shape): what else splits the plots into panels (e.g. "d=64").
    baseline: the impl speed-ups are quoted against; peers: the impls the every-shape ratio is taken against;
    rivals: other projects' impls (Liger-Kernel's) that ours should never be slower than: the every-shape draw
        reports each impl's ratio to the fastest of them too.
    report: per report mode ("quick", "cpu", "gpu") what the report's section on the op measures:
        {"check_shapes", "check_dtypes", "compile_check_shapes", "compile_check_dtypes", "bench_dtypes",
         "bench_sweeps": [{"shapes": [...], "options": {...}}, ...] (the first is plotted),
         "passes": ("forward", "forward+backward"), "x": "numel", "width" or "axis" (what its plots and tables run
         along)}; what a mode leaves out falls back to these defaults (check_shapes, bench_shapes, fp32).
    rows_from: for inputs of at least this many dimensions, the reference of a slice along their first dimension is
        that slice of the reference (GELU: 1, elementwise; softmax: 2, row by row), so the harness may compute it in
        pieces (bench: a case then needs ~3x its input, not ~9x); None: never.
    """

    check_shapes: Sequence[Shape] = ()
    bench_shapes: Sequence[Shape] = ()
    profile_shape: Shape | None = None
    large_shape: Shape | None = None
    random_shape: Callable[..., Shape] | None = None
    axis: tuple[str, Callable[[Shape], int]] | None = None
    panel: Callable[[Shape], str] | None = None
    baseline: str = "torch"
    peers: tuple[str, ...] = ("torch", "compile")
    rivals: tuple[str, ...] = ()
    report: dict[str, dict] = field(default_factory=dict)
    rows_from: int | None = None


@dataclass
class Op:
    """An operation described once: its math, and the impls that compute it.

    reference(*inputs, **options): float64 implementation, inputs already float64 (any device).
    make_inputs(shape, dtype, device, seed, **options): fresh random inputs (never zeros), named by `inputs`.
        `shape` is the op's one size descriptor (what `--shape` parses); the op says what its dimensions mean.
    bytes_moved(shape, dtype, **options): the fewest bytes a fused kernel must read + write.
    flops(shape, **options): floating-point operations of one call.
    tolerance: max relative error ||out - ref|| / ||ref|| per dtype.
    gradient_scale(*inputs, dy, **options): float64 inputs and output gradient -> per input, the norm that its
        gradient's error is measured against where that is larger than the gradient's own norm: the size of the terms
        a backward adds up, for ops whose gradient cancels them (softmax's y * dy on a nearly one-hot row, whose
        gradient is ~(1 - max y) of them, so any rounding of y is magnified 1 / (1 - max y) times). None: ||ref||.
    defaults: what the tools measure of it when told nothing else (`Defaults`).
    options: typed keyword options the impls accept (given as a sequence of Option, kept by name).
    bound: "memory" (quoted in GB/s against the copy ceiling) or "compute" (TFLOP/s against the matmul ceiling).
    traced_impl: the impl a drop-in with impl="auto" runs while torch.compile traces it (`DropIn`): one of plain
        PyTorch ops, which Inductor fuses with the ops around it (a pointwise op into the matmul before it), where a
        kernel of its own would cost more host time than GPU time. None: the native impl, as in eager mode.
    package: the op's folder (`fuselab.ops.gelu`; None for an op without one), where the tools find by name what
        the op has beside its math: `module.py` (its `__all__`: the drop-in nn.Module, `fuselab.nn.<Class>`, built
        with keyword `impl`, whose classmethod drop_in_pair(impl, **options) gives it and its PyTorch counterpart
        configured alike), `functional.py` (its `__all__`: fuselab.nn.functional), `lecture.py` (CLAIMS and
        QUESTIONS, read by fuselab.studies.claims), `tune.py` (the tuner of `fuselab tune`, see
        fuselab.ops.tuning) and `report.md` (the op's own words in its report section).
    """

    name: str
    reference: Callable[..., torch.Tensor]
    make_inputs: InputMaker
    bytes_moved: Callable[..., int]
    flops: Callable[..., int]
    tolerance: dict[torch.dtype, float]
    gradient_scale: Callable[..., Sequence[float]] | None = None
    defaults: Defaults = field(default_factory=Defaults)
    options: dict[str, Option] | Sequence[Option] = field(default_factory=dict)
    inputs: tuple[str, ...] = ("x",)
    bound: Bound = "memory"
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    doc: str = ""
    title: str = ""
    package: str | None = None
    traced_impl: str | None = None
    impls: dict[str, Impl] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.options, dict):
            self.options = {o.name: o for o in self.options}
        if self.bound not in ("memory", "compute"):
            raise ValueError(f"op {self.name!r}: bound must be 'memory' or 'compute', got {self.bound!r}")
        self.title = self.title or self.name

    def report_plan(self, mode: str) -> dict:
        """What the report measures of this op in `mode`, the op's defaults filling what the mode leaves out."""
        d = self.defaults
        plan = {
            "check_shapes": list(d.check_shapes),
            "check_dtypes": ["float32"],
            "compile_check_shapes": list(d.check_shapes)[:1],
            "compile_check_dtypes": ["float32"],
            "bench_dtypes": ["float32"],
            "bench_sweeps": [{"shapes": list(d.bench_shapes), "options": self.default_options()}],
            "passes": ("forward",),
            "x": "axis" if d.axis else "numel",
        }
        plan.update(d.report.get(mode, {}))
        return plan

    def default_profile_shape(self) -> Shape:
        """The shape profile and inspect use when given none: the op's, else its smallest benchmark shape."""
        d = self.defaults
        if d.profile_shape is not None:
            return d.profile_shape
        shapes = list(d.bench_shapes) or list(d.check_shapes)
        return min(shapes, key=lambda s: torch.Size(s).numel())

    @property
    def module(self) -> type | None:
        """The drop-in nn.Module: the first name in the folder's module.py `__all__`, or None."""
        return next(iter(_exported(self.package, "module").values()), None)

    @property
    def functional(self) -> dict[str, Callable]:
        """{name: function} for fuselab.nn.functional: the folder's functional.py `__all__`."""
        return _exported(self.package, "functional")

    @property
    def claims(self) -> Sequence[tuple[str, str, Callable]]:
        """The op's own claims (text, criterion, fn(results) -> (figure, value, held)): lecture.py's CLAIMS."""
        return getattr(_folder_module(self.package, "lecture"), "CLAIMS", ())

    @property
    def questions(self) -> Sequence[tuple[int, str, str, Callable]]:
        """The lecture's questions it answers (order, question, criterion, fn(results) -> (answer, value, held)):
        lecture.py's QUESTIONS."""
        return getattr(_folder_module(self.package, "lecture"), "QUESTIONS", ())

    @property
    def tuner(self) -> str | None:
        """The module of its tuner for `fuselab tune OP` (the folder's tune.py), or None."""
        return f"{self.package}.tune" if _has_module(self.package, "tune") else None

    @property
    def prose(self) -> Path | None:
        """The folder's report.md (the op's own words for its report section), or None."""
        if self.package is None:
            return None
        path = Path(importlib.import_module(self.package).__file__ or "").with_name("report.md")
        return path if path.exists() else None

    def impl(self, name: str, **kwargs: object) -> Callable[[Callable], Callable]:
        """Decorator registering `fn` as implementation `name` (keywords as in :class:`Impl`); returns fn checking
        its inputs (the op's `inputs`, leading positional tensors) against the devices, dtypes and rank declared."""

        def register(fn: Callable) -> Callable:
            if name in self.impls:
                raise ValueError(f"op {self.name!r} already has an impl named {name!r}")
            impl = Impl(name=name, fn=fn, **{"doc": (fn.__doc__ or "").strip(), **kwargs})
            spec = InputSpec(
                impl=f"{self.name} {name}",
                names=tuple(self.inputs),
                devices=tuple(impl.devices),
                dtypes=tuple(impl.dtypes or self.dtypes),
                min_dim=impl.min_dim,
            )
            # a FusedOp whose own check is this very test is not wrapped in it again (a frame less per call)
            tested = getattr(fn, "input_spec", None) == spec
            checked = fn if tested else checked_inputs(fn, **dataclasses.asdict(spec))
            self.impls[name] = dataclasses.replace(impl, fn=checked)
            return checked

        return register

    def native_impl(self, device_type: str) -> str:
        """The impl a drop-in runs when none is named (impl="auto") on `device_type` ("cpu", "cuda"): the first
        registered with a fused kernel of fuselab's own (Triton or CUDA C++) that runs there natively (Triton's not
        on the CPU, where its interpreter is right but orders of magnitude slower), else the op's baseline."""
        key = (self.name, device_type)
        if key not in _NATIVE:
            natives = [
                name
                for name, impl in self.impls.items()
                if impl.inspectable
                and not (impl.triton_kernels is not None and device_type == "cpu")
                and impl.unavailable(device_type) is None
            ]
            _NATIVE[key] = natives[0] if natives else self.defaults.baseline
        return _NATIVE[key]

    def drop_in(self, impl: str) -> DropIn:
        """What a drop-in module running `impl` ("auto": `native_impl`) calls: on the CPU and on a GPU, the impl's
        function (a compiled impl wrapped in torch.compile once; a Triton impl on the CPU warns first, once a process,
        that it runs interpreted); for "auto" on an op with a `traced_impl`, that impl's while torch.compile traces
        it. An unknown name raises ValueError."""
        chosen = {}
        for device_type in ("cpu", "cuda"):
            name = self.native_impl(device_type) if impl == "auto" else impl
            found = self._drop_in_impl(name)
            fn = torch.compile(found.fn) if found.compiled else found.fn
            if device_type == "cpu" and found.triton_kernels is not None:
                fn = _warning_first(self, name, fn)
            chosen[device_type] = (name, fn)
        traced = self.traced_impl if impl == "auto" else None
        return DropIn(
            cpu_impl=chosen["cpu"][0],
            cpu=chosen["cpu"][1],
            cuda_impl=chosen["cuda"][0],
            cuda=chosen["cuda"][1],
            traced_impl=traced,
            traced=self._drop_in_impl(traced).fn if traced is not None else None,
        )

    def _drop_in_impl(self, name: str) -> Impl:
        try:
            return self.get_impl(name)
        except UnknownName as e:
            raise ValueError(str(e)) from None

    def get_impl(self, name: str) -> Impl:
        if name not in self.impls:
            raise UnknownName(f"op {self.name!r} has no impl {name!r}; known: {', '.join(self.impls)}")
        return self.impls[name]

    def default_options(self) -> dict[str, object]:
        return {key: option.default for key, option in self.options.items()}

    def resolve_options(self, given: dict[str, object] | None) -> dict[str, object]:
        """The default options overridden by `given` (strings are parsed to each option's type); unknown keys or
        values raise ValueError."""
        resolved = self.default_options()
        for key, value in (given or {}).items():
            if key not in self.options:
                raise ValueError(f"op {self.name!r} has no option {key!r}; options: {list(self.options) or 'none'}")
            try:
                resolved[key] = self.options[key].parse(value)
            except ValueError as e:
                raise ValueError(f"{self.name}: {e}") from None
        return resolved

    def case_cost(self, shape: Shape, dtype: torch.dtype, options: dict[str, object]) -> tuple[int, int]:
        """(bytes moved, FLOPs) of one call at this case."""
        return self.bytes_moved(shape, dtype, **options), self.flops(shape, **options)


def _has_module(package: str | None, name: str) -> bool:
    return package is not None and importlib.util.find_spec(f"{package}.{name}") is not None


def _folder_module(package: str | None, name: str) -> ModuleType | None:
    """The module `name` of an op's folder (imported), or None when the folder has none."""
    return importlib.import_module(f"{package}.{name}") if _has_module(package, name) else None


def _exported(package: str | None, name: str) -> dict[str, object]:
    """What the folder's module `name` exports ({name: object} of its `__all__`, in order); {} without one."""
    module = _folder_module(package, name)
    return {n: getattr(module, n) for n in getattr(module, "__all__", ())} if module is not None else {}


_NATIVE: dict[tuple[str, str], str] = {}  # (op, device type) -> its native impl (Op.native_impl)


@dataclass(frozen=True, slots=True)
class DropIn:
    """What a drop-in module (fuselab.nn) calls, from `Op.drop_in`: `cpu` or `cuda` by the input's device, and while
    torch.compile traces it, `traced` (None: as in eager mode). Kept flat, and chosen by `pick` alone, because while
    tracing every object the module reads becomes a guard that each compiled call evaluates: the path through a dict
    and a closure cost 0.8 µs of guards a call more (docs/call-cost.md)."""

    cpu_impl: str
    cpu: Callable
    cuda_impl: str
    cuda: Callable
    traced_impl: str | None = None
    traced: Callable | None = None

    def pick(self, x: torch.Tensor) -> Callable:
        """The function to call on `x`."""
        if self.traced is not None and is_compiling():
            return self.traced
        return self.cuda if x.is_cuda else self.cpu

    def describe(self) -> str:
        """What runs where, for a module's repr: "torch on cpu, triton on cuda, torch under torch.compile" (the last
        for an op with a `traced_impl`)."""
        where = f"{self.cpu_impl} on cpu, {self.cuda_impl} on cuda"
        return where if self.traced_impl is None else f"{where}, {self.traced_impl} under torch.compile"


_WARNED: set[tuple[str, str]] = set()  # (op, impl) already warned of running interpreted, in this process


def warn_if_interpreted(op: Op, impl: str) -> None:
    """Warn that `impl` of `op` runs under Triton's interpreter on the CPU, when it does: once a process for each op
    and impl (however many modules run it), at the first line of the caller's code outside fuselab and torch."""
    if op.get_impl(impl).triton_kernels is None or (op.name, impl) in _WARNED:
        return
    _WARNED.add((op.name, impl))
    warnings.warn(
        f"{op.name} impl {impl!r} on the CPU runs under Triton's interpreter: right, but orders of magnitude "
        f"slower than impl={op.defaults.baseline!r} (which impl='auto' picks there)",
        UserWarning,
        stacklevel=_outside_stacklevel(),
    )


def _warning_first(op: Op, impl: str, fn: Callable) -> Callable:
    """fn, calling `warn_if_interpreted` first, except while torch.compile traces it."""

    @functools.wraps(fn)
    def warning_first(*args: object, **kwargs: object) -> object:
        if not torch.compiler.is_compiling():
            warn_if_interpreted(op, impl)
        return fn(*args, **kwargs)

    return warning_first


_INSIDE = tuple(str(Path(m.__file__).parent) + "/" for m in (torch, importlib.import_module("fuselab")))


def _outside_stacklevel() -> int:
    """warnings.warn's stacklevel, for a call from a function called here, that names the first frame outside
    fuselab and torch (the user's line calling the module, not torch's Module.__call__)."""
    frame, level = sys._getframe(2), 2  # _getframe(k) is stacklevel k: 1 is the function calling warnings.warn
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level


def register_op(op: Op) -> Op:
    if op.name in _REGISTRY:
        raise ValueError(f"an op named {op.name!r} is already registered")
    _REGISTRY[op.name] = op
    return op


def unregister_op(name: str) -> None:
    """Remove an op (an op a test or a plugin registered for a while); unknown names are ignored."""
    _REGISTRY.pop(name, None)


def get_op(name: str) -> Op:
    _load_builtin_ops()
    if name not in _REGISTRY:
        raise UnknownName(f"unknown op {name!r}; known ops: {', '.join(sorted(_REGISTRY)) or 'none'}")
    return _REGISTRY[name]


def all_ops() -> list[Op]:
    _load_builtin_ops()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def _load_builtin_ops() -> None:
    import fuselab.ops  # noqa: F401  (importing the package discovers and registers every op folder)


def discover(package: str = "fuselab.ops") -> list[str]:
    """Import every subpackage of `package` (each op folder registers itself); return their names.

    Folders whose name starts with "_" (shared helpers such as _cuda) are skipped.
    """
    module = importlib.import_module(package)
    names = []
    for info in pkgutil.iter_modules(module.__path__):
        if info.ispkg and not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")
            names.append(info.name)
    return names


_POWER = re.compile(r"^(\d+)\^(\d+)$")


def randn(shape: Shape, dtype: torch.dtype, device: str, seed: int, scale: float = 1.0) -> torch.Tensor:
    """scale * N(0, 1) of `shape`, drawn in float32 from a generator seeded with `seed`, then cast to `dtype` (scaled
    in place: a 16-bit tensor's making peaks at 3x its size, not 5x)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(scale).to(dtype)


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
