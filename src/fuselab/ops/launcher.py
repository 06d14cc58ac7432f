"""Compiled Triton kernels launched from C, at the host cost of a built-in op.

Triton's own launch (`JITFunction.run`) binds and specializes every argument in Python, builds the cache key, looks
up the binary and calls its launcher: some 20 us of host time a call on the H200's host, more than a small kernel
runs. `fast(kernel)` returns a drop-in for the @triton.jit function at a launch site (``fast(kernel)[grid](*args,
**constexprs)``) whose per-call path is one call into a small C module (_cuda/launcher.c): it reads the
specialization Triton would compile for from the arguments themselves (pointer dtype and 16-byte alignment; integer
width, == 1, multiple of 16), finds the binary Triton compiled for it and launches it with cuLaunchKernel on the
current stream. The first call of each key goes through Triton (which compiles if need be, and launches); its
binary is then registered, so every later call with the same key skips Triton. Triton's host-side TensorDescriptors
are passed too: the C module encodes each CUtensorMap (cuTensorMapEncodeTiled) as Triton's launcher does. What it
does not pass (launch hooks, kernels needing scratch memory or clusters, grids given as functions) stays with Triton,
call by call.

The C module is built once per Python and source version with the system's C compiler (the one Triton itself needs
for its launchers) into ~/.cache/fuselab/ext/fuselab_launcher (or $FUSELAB_EXT_DIR). FUSELAB_LAUNCHER=triton, or
`enabled(False)`, keeps every launch with Triton (to compare, or to rule the launcher out).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).parent / "_cuda" / "launcher.c"
HEADER = SOURCE.with_name("launcher_api.h")  # its C API, which the replays' C++ autograd (replay.cpp) includes
MODULE_NAME = "fuselab_launcher"
# dtype numbers of the key (< 32); a tensor of another dtype goes to Triton
DTYPES = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2,
)  # fmt: skip
# how the C module passes a value of each Triton signature type (its `layout` chars)
PASS = {"i32": "i", "i64": "l", "u64": "K", "u1": "B", "fp32": "f"}
NUMBERS = {d: i for i, d in enumerate(DTYPES)}


class _State:
    enabled = os.environ.get("FUSELAB_LAUNCHER", "fuselab") != "triton"


def enabled_now() -> bool:
    """Whether launch sites use this launcher now (`enabled`, FUSELAB_LAUNCHER)."""
    return _State.enabled


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Within the block, launch sites use this launcher (on) or Triton's own launch (off), and fused ops replay their
    calls (on) or run their Python (off)."""
    before = _State.enabled
    _set_enabled(on)
    try:
        yield
    finally:
        _set_enabled(before)


def _set_enabled(on: bool) -> None:
    _State.enabled = on
    if _LOADED:  # the C module's switch of Replayer.call (read at its load otherwise)
        _LOADED[0].set_enabled(on)


@functools.cache
def module() -> ModuleType | None:
    """The C module, built on first use; None (with a warning, once) where it cannot be built."""
    try:
        return _load(_build())
    except Exception as exc:  # no compiler, no Python headers: Triton's own launch still works
        warnings.warn(f"fuselab launcher unavailable, Triton launches its kernels itself: {exc}", stacklevel=2)
        return None


def _build() -> Path:
    """Compile SOURCE into a shared library named after its content and this Python; return its path."""
    digest = hashlib.sha256(SOURCE.read_bytes() + HEADER.read_bytes() + sys.version.encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    root = Path(os.environ.get("FUSELAB_EXT_DIR", Path.home() / ".cache" / "fuselab" / "ext")) / MODULE_NAME
    target = root / f"{MODULE_NAME}-{digest}{suffix}"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    include = sysconfig.get_paths()["include"]
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        built = Path(tmp) / target.name
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", str(built), "-ldl"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
        os.replace(built, target)  # atomic: concurrent builders race harmlessly
    return target


_LOADED: list[ModuleType] = []  # the C module once loaded


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.set_enabled(_State.enabled)
    _LOADED[:] = [mod]
    return mod


def new_launcher() -> object | None:
    """A C Launcher (one kernel at one set of compile-time options), or None without the C module."""
    mod = module()
    return None if mod is None else mod.Launcher(NUMBERS, _descriptor_type())


@functools.cache
def _descriptor_type() -> type | None:
    """Triton's host-side TensorDescriptor class (None without it): the C module passes its instances."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:  # pragma: no cover (a Triton without host descriptors)
        return None
    return TensorDescriptor


def descriptors(compiled: object) -> list[tuple[int, int, int, tuple[int, ...]]] | None:
    """How `compiled` takes its tensor descriptor arguments, in order, as the C module encodes them: (swizzle,
    element size, the driver's element type, block shape) each, from Triton's tensordesc_meta; [] for a binary that
    takes none; None where the C module cannot pass them (the descriptors lowered to pointers, FP4 padding)."""
    types = [t for t in dict(compiled.src.signature).values() if isinstance(t, str) and t.startswith("tensordesc")]
    if not types:
        return []
    meta = getattr(compiled.metadata, "tensordesc_meta", None)
    try:
        from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST
    except ImportError:  # pragma: no cover (another Triton)
        return None
    if not meta or len(meta) != len(types) or any(m.get("fp4_padded") for m in meta):
        return None
    return [
        (m["swizzle"], m["elem_size"], TMA_DTYPE_DEVICE_TO_HOST[m["elem_type"]], tuple(m["block_size"])) for m in meta
    ]


def layout(compiled: object, n_args: int) -> str | None:
    """How the C module passes the `n_args` positional arguments of a launch to `compiled` (a Triton CompiledKernel):
    one char per argument ('-' a constant of the binary, 'p' a pointer, 'D' a tensor descriptor, or PASS's), or None
    when the binary needs what the C module does not do (scratch memory, clusters, cooperative or PDL launches,
    descriptors it cannot encode, a parameter given as a keyword that is not a constant)."""
    md = compiled.metadata
    needs = (
        getattr(md, "num_ctas", 1) != 1
        or getattr(md, "launch_cooperative_grid", False)
        or getattr(md, "launch_pdl", False)
        or getattr(md, "global_scratch_size", 0)
        or getattr(md, "profile_scratch_size", 0)
    )
    if needs or descriptors(compiled) is None:
        return None
    src = compiled.src
    names = list(src.fn.arg_names)
    types = dict(src.signature)  # name (or index) -> type; "constexpr" for constants
    constants = {k[0] if isinstance(k, tuple) else k for k in getattr(src, "constants", {})}
    chars = []
    for i, name in enumerate(names):
        ty = types.get(name, types.get(i, "constexpr"))
        constant = ty == "constexpr" or i in constants or name in constants
        if i >= n_args:
            if not constant:
                return None  # a runtime parameter given by keyword: Triton's path
            continue
        if constant:
            chars.append("-")
        elif ty.startswith("*"):
            chars.append("p")
        elif ty.startswith("tensordesc"):
            chars.append("D")
        elif ty in PASS:
            chars.append(PASS[ty])
        else:
            return None
    return "".join(chars) if len(chars) == n_args else None


class FastKernel:
    """A @triton.jit kernel launched through the C module: ``FastKernel(k)[grid](*args, **constexprs)`` as Triton's
    ``k[grid](...)``; returns None (Triton's returns the compiled kernel)."""

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel
        self._configs: dict[tuple, object] = {}  # compile-time options -> C Launcher (or None: Triton launches)

    def __getitem__(self, grid: Sequence[int]) -> functools.partial:
        return functools.partial(self.launch, grid)

    def launch(self, grid: Sequence[int], *args: object, **meta: object) -> None:
        """Launch on `grid` (1 to 3 ints): from C when a binary is registered for the arguments' key, else through
        Triton (registering the binary it used, or refusing the key for good). Within `recording()`, each launch is
        noted (or the recording marked not replayable, for one Triton made)."""
        try:
            config = self._configs[tuple(meta.items())]
        except KeyError:
            config = self._configs[tuple(meta.items())] = new_launcher()
        except TypeError:  # an unhashable option
            config = None
        noted = getattr(_LOCAL, "recording", None)
        if config is not None:
            device = _current_device()
            done = config.launch(grid, device, _current_stream(device), *args)
            if done is not None:
                if done is not True:  # the key, with nothing registered for it yet: Triton launches
                    done = self._register(config, done, grid, args, meta)
                if noted is not None and done:
                    noted.note(config, grid, args, device)
                elif noted is not None:
                    noted.mark_not_replayable()
                return
        if noted is not None:
            noted.mark_not_replayable()
        self.kernel[grid](*args, **meta)

    def _register(self, config: object, key: bytes, grid: Sequence[int], args: tuple, meta: dict) -> bool:
        """Launch through Triton and register the binary it used for `key`, or refuse the key (the C module cannot
        pass its arguments, or a launch hook is set) so that later calls go straight to Triton; whether it was
        registered."""
        compiled = self.kernel[grid](*args, **meta)
        chars = layout(compiled, len(args)) if compiled is not None and not _launch_hooks() else None
        if chars is None:
            config.refuse(key)
            return False
        compiled._init_handles()
        md = compiled.metadata
        config.add(key, compiled.function, md.num_warps, md.shared, chars, descriptors(compiled))
        return True


def _launch_hooks() -> bool:
    """Whether Triton's launch hooks are set (a profiler such as proton): then launches stay with Triton."""
    try:
        from triton import knobs
    except ImportError:  # pragma: no cover (older Triton)
        return True
    hooks = (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
    return any(h is not None and getattr(h, "calls", True) for h in hooks)


_FAST: dict[object, FastKernel] = {}
# what Triton launches on: the current device and its current stream (absent from a CPU build of torch, where no
# launcher is ever built past new_launcher's module: kernels there run under the interpreter)
_current_device = getattr(torch._C, "_cuda_getDevice", None)
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def fast(kernel: object) -> object:
    """`kernel` (a @triton.jit function) as launch sites launch it outside tracing: a FastKernel when the launcher
    is enabled and built, else the kernel itself, whose launches a recording cannot see (it is then marked not
    replayable: a recipe without them would skip them)."""
    if _State.enabled:
        wrapped = _FAST.get(kernel)
        if wrapped is not None:
            return wrapped
        from triton.runtime.jit import JITFunction

        if isinstance(kernel, JITFunction) and _current_device is not None and module() is not None:
            wrapped = _FAST[kernel] = FastKernel(kernel)
            return wrapped
    noted = getattr(_LOCAL, "recording", None)
    if noted is not None:  # not a plain kernel (a wrapper, an autotuner), a torch without CUDA, or no C module
        noted.mark_not_replayable()
    return kernel


# ---------------------------------------------------------------------------------------------- workspaces


def tracing() -> bool:
    """Whether torch is tracing this call: Dynamo compiling, or a dispatch mode on the stack (fake, functional)."""
    return torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a CUDA graph (False before CUDA is initialized)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


_WORKSPACES: dict[tuple, torch.Tensor] = {}  # (name, dtype, device, stream, zeros) -> the buffer kept for them
_HELD: dict[int, tuple[torch.Tensor, int]] = {}  # a kept buffer's address -> (the buffer, its stream)


def workspace(name: str, numel: int, dtype: torch.dtype, device: torch.device, zeros: bool = True) -> torch.Tensor:
    """`numel` elements of a buffer kept from call to call, one per name, dtype, device and current stream, for
    kernels that leave it as they found it (counters set back to zero: `zeros`, made of zeros) or write it before
    they read it (scratch: zeros False, made of any values), so that a call needs no allocation or fill. Grown, anew,
    when too small. Calls on one stream run in order, so they never share it at once. A recipe may hold it
    (`recipe`): its replays then run on that stream alone. While torch traces (torch.compile) or a CUDA graph is
    captured, a fresh buffer (a graph's buffers are its own), zeroed only where `zeros` asks: a captured fill runs at
    every replay, before the kernels that wait on it."""
    if tracing() or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return (torch.zeros if zeros else torch.empty)(numel, dtype=dtype, device=device)
    stream = _current_stream(device.index) if device.type == "cuda" and _current_stream is not None else 0
    key = (name, dtype, device, stream, zeros)  # a name asked for with and without zeros: two buffers
    buffer = _WORKSPACES.get(key)
    if buffer is None or buffer.numel() < numel:
        size = max(numel, 2 * buffer.numel() if buffer is not None else 0)
        buffer = _WORKSPACES[key] = (torch.zeros if zeros else torch.empty)(size, dtype=dtype, device=device)
        _HELD[buffer.data_ptr()] = (buffer, stream)  # the old one stays valid for the recipes that hold it
    return buffer[:numel]


# ---------------------------------------------------------------------------------------------- replays
#
# A fused op whose eager forward allocates its outputs and writes them with Triton kernels only (define_op(...,
# replay=True)) is replayed from C: the first call of a key (its tensors' dtypes, devices, shapes, strides, alignment,
# and its options) runs the Python forward under `recording()`; `recipe` turns what it launched into a C Recipe (the
# outputs' allocation, each launch's binary, grid and values, its pointers and descriptors' bases mapped to the call's
# inputs and outputs); later calls of that key are one C call (`Replayer.replay`; `Replayer.call` takes a user's call
# as made, options by keyword included, before any Python of the op's: fuselab.ops.library.FusedOp.__call__).

_LOCAL = threading.local()
MAX_STEPS = 8  # launches a recipe holds (launcher_api.h's FUSELAB_RECIPE_MAX_STEPS, the C module's MAX_STEPS)
MAX_OUTPUTS = 4  # outputs a recipe allocates (FUSELAB_RECIPE_MAX_OUTPUTS, the C module's MAX_OUTPUTS)


class Recording:
    """What a forward launched while recorded: (launcher, grid, args, device) per launch from C, and whether every
    launch was one (a launch left to Triton, a binary it would not register, makes the call not replayable)."""

    def __init__(self) -> None:
        self.launches: list[tuple[object, tuple[int, ...], tuple, int]] = []
        self.replayable = True

    def note(self, launcher: object, grid: Sequence[int], args: tuple, device: int) -> None:
        """A launch from C (or one Triton made whose binary is now registered)."""
        self.launches.append((launcher, tuple(grid), args, device))

    def mark_not_replayable(self) -> None:
        """A launch left to Triton."""
        self.replayable = False


def recording_now() -> bool:
    """Whether this thread's launches are being recorded (a fused op called inside another's recorded forward must
    run its own forward, so that the outer recording sees its launches)."""
    return getattr(_LOCAL, "recording", None) is not None


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record the FastKernel launches of this thread within the block."""
    noted, before = Recording(), getattr(_LOCAL, "recording", None)
    _LOCAL.recording = noted
    mod = _LOADED[0] if _LOADED else None  # Replayer.call reads the C module's per-thread depth
    if mod is not None:
        mod.recording(1)
    try:
        yield noted
    finally:
        _LOCAL.recording = before
        if mod is not None:
            mod.recording(-1)


REPLAYS_SOURCE = SOURCE.with_name("replay.cpp")


@functools.cache
def replays_module() -> ModuleType | None:
    """The replays' C++ extension (_cuda/replay.cpp: keys read from at::Tensor, recipes run through the C module's
    API, the C++ autograd), built on first use (~1 min, cached like the CUDA ops' extensions); None (with a warning,
    once) where it cannot be built: the C module's Replayer then replays, and gradients go through Python."""
    from fuselab.ops.backends import cuda_unavailable, load_cuda_extension

    if _current_stream is None or module() is None:
        return None
    why = cuda_unavailable("cuda")
    if why is None:
        try:
            return load_cuda_extension("fuselab_replay", (str(REPLAYS_SOURCE),))
        except Exception as exc:  # a compiler or header missing: the C Replayer still replays
            why = str(exc)[-2000:]
    warnings.warn(f"fuselab replays: the C++ extension is unavailable, forward and backward replay slower: {why}",
                  stacklevel=2)  # fmt: skip
    return None


def new_replays(
    tensor_index: int, saved_from: Sequence[tuple[bool, int]], backward_sources: Sequence[tuple[int, int]],
    backward: Callable[..., torch.Tensor] | None,
) -> object | None:  # fmt: skip
    """A C++ Replays for one fused op (its forward keyed from at::Tensor; a C++ autograd where the one tensor input
    needs grad), or None without the extension. The arguments say how its backward is called
    (replay.cpp's `Replays`); backward(key | None, options, grad, saved) is the op's Python backward of a call the
    C++ autograd took, recording a recipe for `key` (given where none is held) with `add_backward`."""
    mod = replays_module()
    if mod is None:
        return None
    return mod.Replays(module().api, list(DTYPES), tensor_index, list(saved_from), list(backward_sources), backward)


def new_replayer() -> object | None:
    """A C Replayer for one fused op, or None where nothing is launched from C (no C module, a torch without
    CUDA)."""
    mod = module() if _current_stream is not None else None
    if mod is None:
        return None
    return mod.Replayer(NUMBERS, torch.empty_strided, _current_stream, torch.Tensor)


def _dense(t: torch.Tensor) -> bool:
    """Whether `t` fills its memory without gaps or overlaps: contiguous once its dimensions are ordered by stride."""
    return t.permute(sorted(range(t.dim()), key=lambda d: -t.stride(d))).is_contiguous()


def recipe(args: Sequence[object], out: object, noted: Recording) -> object | None:
    """The C Recipe that redoes a call with `args` that returned `out` (a tensor, or a tuple of up to MAX_OUTPUTS) and
    launched `noted`, or None when it cannot: a launch not from C, more than MAX_STEPS launches, an output not dense (a
    view with gaps or overlaps) or on another device, an output torch wrote in place (its version counter moved: a
    recipe redoes the launches alone), a launch given a tensor (or a descriptor's base) that is neither an input, nor an
    output, nor part of a `workspace` (a copy, a buffer made per call), tensors sharing an address. A workspace's
    address is kept as it was, the recipe holding the buffer and running on its stream alone. The outputs are allocated
    as this call's were (shape, strides, dtype: the key fixes them). The recipe keeps the call's options (its arguments
    that are not tensors), which the C++ autograd hands to the backward's Python path."""
    outs = out if isinstance(out, tuple) else (out,)
    if not noted.replayable or len(noted.launches) > MAX_STEPS or not 0 < len(outs) <= MAX_OUTPUTS:
        return None
    if not all(type(o) is torch.Tensor and o.is_cuda and _dense(o) and o.dtype in NUMBERS for o in outs):
        return None
    if any(o._version for o in outs):  # torch wrote an output in place (a zero_ of rows no kernel writes): not redone
        return None
    device = outs[0].get_device()
    by_address: dict[int, int] = {}  # a tensor's address -> its call argument i, or output j as -1 - j
    sources = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    sources += [(-1 - j, o) for j, o in enumerate(outs) if o.numel() > 0]
    for i, t in sources:
        if by_address.setdefault(t.data_ptr(), i) != i or (i < 0 and t.get_device() != device):
            return None
    descriptor = _descriptor_type()
    steps, keep, streams = [], {}, set()
    for launcher, grid, launch_args, launch_device in noted.launches:
        binary = launcher.binary(launch_device, *launch_args)
        values = launcher.values(launch_device, *launch_args)
        if launch_device != device or binary is None or values is None:
            return None
        patches = []
        for k, a in enumerate(launch_args):
            t = a.base if descriptor is not None and type(a) is descriptor else a
            if isinstance(t, torch.Tensor):
                address = t.data_ptr()
                if address in by_address:
                    patches.append((k, by_address[address]))
                elif (held := _HELD.get(t.untyped_storage().data_ptr())) is not None:
                    keep[id(held[0])] = held[0]  # a workspace: its address stays in the values
                    streams.add(held[1])
                else:
                    return None
        steps.append((binary, (*grid, 1, 1)[:3], values, tuple(patches)))
    if len(streams) > 1:
        return None
    options = tuple(a for a in args if not isinstance(a, torch.Tensor))
    stream = streams.pop() if streams else 0
    layouts = tuple((tuple(o.shape), NUMBERS[o.dtype], tuple(o.stride())) for o in outs)
    return module().Recipe(device, layouts, tuple(steps), tuple(keep.values()), stream, options)
