"""fuselab.ops.launcher: compiled Triton kernels launched from C. On the CPU: the C module builds, its keys split
every argument Triton would compile apart (so a binary is never reused for arguments it was not compiled for), and a
binary's layout is read right from a compiled kernel's signature. On the GPU: launches from C give Triton's results
bitwise, the second call of a key never enters Triton, and a new key does."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest
import torch

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before any kernel is defined)
from fuselab.ops import launcher

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


class TensorLike:
    """What the C module reads of a tensor: is_cuda, dtype, data_ptr()."""

    def __init__(self, dtype: torch.dtype, address: int, is_cuda: bool = True) -> None:
        self.dtype, self.address, self.is_cuda = dtype, address, is_cuda

    def data_ptr(self) -> int:
        return self.address


def c_launcher() -> object:
    made = launcher.new_launcher()
    if made is None:
        pytest.fail("the launcher's C module did not build (a C compiler and Python.h are needed)")
    return made


def test_keys_split_what_triton_specializes_on() -> None:
    """Arguments with one key have one Triton specialization (type and alignment / divisibility / constant 1)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    rng = random.Random(7)
    edges = [0, 1, -1, 2, 15, 16, 17, 32, 2**31 - 16, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32, 2**63 - 1]
    edges += [2**63, 2**64 - 16, 2**64 - 1]
    ints = edges + [rng.randrange(-(2**40), 2**40) for _ in range(300)] + [16 * rng.randrange(1, 10**6)]
    tensors = [
        TensorLike(dtype, 2**30 + offset)
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64)
        for offset in (0, 2, 4, 8, 16, 48, 1000)
    ]
    values: list[object] = [*ints, *tensors, True, False, 0.5, -3.25, None]
    L = c_launcher()
    by_key: dict[bytes, set] = {}
    for v in values:
        key = L.key(0, v)
        assert key is not None, v
        spec = native_specialize_impl(BaseBackend, _as_triton_arg(v), False, True, True)
        by_key.setdefault(key, set()).add(repr(spec))
    assert all(len(specs) == 1 for specs in by_key.values()), by_key
    assert len(by_key) >= 12  # it does split: i32/i64/u64 x (1, 16k, other), dtypes x alignment, bool, float, None
    assert L.key(0, 3, TensorLike(torch.float32, 64)) != L.key(1, 3, TensorLike(torch.float32, 64))  # per device


def descriptor(dtype: torch.dtype = torch.bfloat16, block: tuple = (1, 1, 64, 64), address: int = 2**30,
               shape: tuple = (2, 16, 1000, 64), padding: str = "zero") -> object:  # fmt: skip
    """Triton's host TensorDescriptor over a stand-in CUDA tensor (contiguous strides of `shape`)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    strides = torch.empty(shape, device="meta").stride()
    return TensorDescriptor(TensorLike(dtype, address), list(shape), list(strides), list(block), padding)


def test_descriptor_keys_split_what_triton_specializes_on() -> None:
    """A TensorDescriptor's key holds its base's dtype, its block shape and its padding: descriptors with one key have
    one Triton specialization, and ones Triton compiles apart have different keys; its shape, strides and address
    (past 16-byte alignment) are not part of it. A base TMA cannot take (not 16-byte aligned, on the CPU) is
    Triton's."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    L = c_launcher()
    shapes = {4: ((2, 16, 1000, 64), (1, 3, 77, 80)), 2: ((700, 96), (64, 64))}
    descs = [
        descriptor(dtype, block, address, shape)
        for dtype in (torch.bfloat16, torch.float16, torch.float32)
        for block in ((1, 1, 64, 64), (1, 1, 128, 64), (1, 1, 64, 16), (64, 32))
        for address in (2**30, 2**30 + 4096)
        for shape in shapes[len(block)]
    ]
    by_key: dict[bytes, set] = {}
    specs: dict[str, set] = {}
    for d in descs:
        key = L.key(0, d, 7)
        assert key is not None
        spec = repr(native_specialize_impl(BaseBackend, d, False, True, True))
        by_key.setdefault(key, set()).add(spec)
        specs.setdefault(spec, set()).add(key)
    assert all(len(s) == 1 for s in by_key.values()), by_key
    assert len(by_key) == len(specs) == 12  # 3 dtypes x 4 block shapes
    assert L.key(0, descriptor(padding="nan"), 7) != L.key(0, descriptor(), 7)
    misaligned, cpu = descriptor(), descriptor()
    misaligned.base.address += 8  # TMA needs a 16-byte aligned base (Triton asserts it when made): Triton's
    cpu.base.is_cuda = False
    assert L.key(0, misaligned, 7) is None and L.key(0, cpu, 7) is None


def _as_triton_arg(v: object) -> object:
    """A TensorLike as the torch tensor Triton would see (its specialization reads data_ptr() and dtype)."""
    if not isinstance(v, TensorLike):
        return v
    return SimpleNamespace(data_ptr=v.data_ptr, dtype=v.dtype)


def test_arguments_the_launcher_cannot_pass_go_to_triton() -> None:
    """launch() answers None (stay with Triton) for a CPU tensor, an unknown object, a dtype it does not number, a
    grid that is not 1 to 3 ints, and the key (no binary yet) for what it can pass; once a key is refused, None for
    it; nothing is launched either way."""
    L = c_launcher()
    cpu = torch.randn(4)
    assert L.launch((1,), 0, 0, cpu) is None
    assert L.launch((1,), 0, 0, object()) is None
    assert L.launch((1,), 0, 0, TensorLike(torch.complex64, 64)) is None
    assert L.launch((1,), 0, 0, 2**70) is None
    arg = TensorLike(torch.float32, 64)
    assert L.launch(lambda meta: (1,), 0, 0, arg) is None  # a grid function: Triton's
    assert L.launch((1, 1, 1, 1), 0, 0, arg) is None
    assert L.launch((1.0,), 0, 0, arg) is None
    key = L.key(0, arg, 7, 0.5, True, None)
    assert L.launch((4, 2), 0, 0, arg, 7, 0.5, True, None) == key
    assert L.launch([4], 0, 0, arg, 7, 0.5, True, None) == key
    L.refuse(key)
    assert L.launch([4], 0, 0, arg, 7, 0.5, True, None) is None  # refused: Triton's, without another try
    assert L.launch([4], 0, 0, arg, 16, 0.5, True, None) not in (None, True)  # another key (16k) still asks
    assert L.size() == 0 and L.binary(0, arg, 7, 0.5, True, None) is None
    with pytest.raises(TypeError):
        L.refuse("not bytes")


def test_add_checks_the_layout() -> None:
    L = c_launcher()
    key = L.key(0, TensorLike(torch.float32, 64), 7)
    with pytest.raises(ValueError, match="one char per argument"):
        L.add(key, 0, 4, 0, "p")
    with pytest.raises(ValueError, match="unknown layout"):
        L.add(key, 0, 4, 0, "pz")
    with pytest.raises(ValueError, match="unknown layout"):
        L.add(key, 0, 4, 0, "p\0")
    L.add(key, 0, 4, 0, "pi")
    assert L.size() == 1
    with_desc = L.key(0, descriptor(), 7)
    meta = (128, 2, 10, (1, 1, 64, 64))  # swizzle, element size, the driver's bf16, block
    with pytest.raises(ValueError, match="a meta per descriptor"):
        L.add(with_desc, 0, 4, 0, "Di")
    with pytest.raises(ValueError, match="a meta per descriptor"):
        L.add(with_desc, 0, 4, 0, "Di", [meta, meta])
    with pytest.raises(ValueError, match="a meta per descriptor"):
        L.add(with_desc, 0, 4, 0, "Di", [(128, 2, 10, (1, 64, 64))])  # its rank is not the key's
    with pytest.raises(ValueError, match="not valid"):
        L.add(with_desc, 0, 4, 0, "Di", [(128, 2, 10, (1, 1, 64, 512))])  # past TMA's box
    L.add(with_desc, 0, 4, 0, "Di", [meta])
    assert L.size() == 2


def _compiled(signature: dict, metadata: dict | None = None) -> SimpleNamespace:
    """A stand-in for Triton's CompiledKernel: src.fn.arg_names, src.signature, src.constants, metadata."""
    md = {"num_ctas": 1, "launch_cooperative_grid": False, "launch_pdl": False, "global_scratch_size": 0}
    md.update(profile_scratch_size=0, tensordesc_meta=None, num_warps=4, shared=0)
    md.update(metadata or {})
    src = SimpleNamespace(fn=SimpleNamespace(arg_names=list(signature)), signature=signature, constants={})
    return SimpleNamespace(src=src, metadata=SimpleNamespace(**md))


def test_layout_follows_the_compiled_signature() -> None:
    sig = {"x": "*fp32", "y": "*bf16", "n": "i32", "big": "i64", "one": "constexpr", "flag": "u1", "alpha": "fp32"}
    sig.update(BLOCK="constexpr")
    assert launcher.layout(_compiled(sig), 7) == "ppil-Bf"
    assert launcher.layout(_compiled(sig, {"global_scratch_size": 128}), 7) is None  # scratch: Triton's path
    assert launcher.layout(_compiled(sig, {"num_ctas": 2}), 7) is None
    assert launcher.layout(_compiled({**sig, "n": "fp16"}), 7) is None  # a type it does not pass
    assert launcher.layout(_compiled(sig), 6) is None  # a runtime parameter given by keyword
    tma = {"q": "tensordesc<bf16[1, 1, 64, 64]>", "q2": "constexpr", "lse": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    meta = {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [1, 1, 64, 64], "fp4_padded": False}
    compiled = _compiled(tma, {"tensordesc_meta": [meta]})
    assert launcher.layout(compiled, 4) == "D-pi"
    assert launcher.descriptors(compiled) == [(3, 2, 8, (1, 1, 64, 64))]  # the device's bf16 (9) is the host's 8
    assert launcher.descriptors(_compiled(sig)) == []
    assert launcher.layout(_compiled(tma), 4) is None  # lowered to pointers (no meta): Triton's path
    assert launcher.layout(_compiled(tma, {"tensordesc_meta": [{**meta, "fp4_padded": True}]}), 4) is None


def test_disabled_or_unbuilt_launchers_leave_kernels_to_triton(monkeypatch) -> None:
    kernel = triton.runtime.jit.JITFunction(_noop_kernel)
    monkeypatch.setattr(launcher, "_current_device", lambda: 0)  # as with a CUDA build of torch
    with launcher.enabled(False):
        assert launcher.fast(kernel) is kernel
    assert isinstance(launcher.fast(kernel), launcher.FastKernel)
    monkeypatch.setattr(launcher, "_FAST", {})
    monkeypatch.setattr(launcher, "module", lambda: None)
    assert launcher.fast(kernel) is kernel
    fn = lambda x: x  # noqa: E731
    assert launcher.fast(fn) is fn  # not a JITFunction: returned as is


def _noop_kernel(x):
    pass


# ---------------------------------------------------------------------------------------------- on the GPU


@triton.jit
def _scale_kernel(x_ptr, y_ptr, n, alpha, negate, BLOCK: tl.constexpr):
    """y = alpha * x (negated when negate), n elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n).to(tl.float32)
    y = -alpha * x if negate else alpha * x
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=offs < n)


class NoTriton:
    """Stands for the kernel after its first launch: any call through Triton fails the test."""

    def __getitem__(self, grid: object) -> object:
        raise AssertionError("launched through Triton")


@pytest.mark.gpu
def test_gpu_launches_from_c_match_triton_and_skip_it_after_the_first_call_of_a_key() -> None:
    fast = launcher.FastKernel(_scale_kernel)
    for n, dtype, offset, negate in itertools.product((1, 17, 4096, 100_003), (torch.float32, torch.bfloat16),
                                                      (0, 1), (False, True)):  # fmt: skip
        x = torch.randn(n + offset, device="cuda", dtype=dtype)[offset:]
        y, ref = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
        grid = (triton.cdiv(n, 256),)
        _scale_kernel[grid](x, ref, n, 0.75, negate, BLOCK=256)
        fast.kernel = _scale_kernel
        fast[grid](x, y, n, 0.75, negate, BLOCK=256)  # a new key: through Triton, then registered
        torch.testing.assert_close(y, ref, rtol=0, atol=0)
        y.fill_(float("nan"))
        fast.kernel = NoTriton()
        fast[grid](x, y, n, 0.75, negate, BLOCK=256)  # the same key: from C
        torch.testing.assert_close(y, ref, rtol=0, atol=0)
    configs = list(fast._configs.values())
    assert len(configs) == 1 and configs[0].size() >= 8  # n classes x dtypes x alignment x negate


@pytest.mark.gpu
def test_gpu_a_cpu_tensor_gets_tritons_error_not_a_launch() -> None:
    fast = launcher.FastKernel(_scale_kernel)
    x = torch.randn(64, device="cuda")
    fast[(1,)](x, torch.empty_like(x), 64, 1.0, False, BLOCK=64)
    with pytest.raises(Exception, match=r"(?i)pointer|cpu|device"):
        fast[(1,)](x.cpu(), torch.empty_like(x), 64, 1.0, False, BLOCK=64)
    torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------- replays


class CallTensor(TensorLike):
    """What the Replayer reads of a tensor: TensorLike's, and get_device(), shape, stride()."""

    def __init__(self, dtype: torch.dtype, address: int, shape: tuple, strides: tuple, device: int = 0) -> None:
        super().__init__(dtype, address)
        self.shape, self.strides, self.device_index = torch.Size(shape), strides, device

    requires_grad = False

    def get_device(self) -> int:
        return self.device_index

    def stride(self) -> tuple:
        return self.strides


def c_replayer() -> object:
    mod = launcher.module()
    if mod is None:
        pytest.fail("the launcher's C module did not build")
    return mod.Replayer(launcher.NUMBERS, torch.empty_strided, id, CallTensor)


def test_recipe_limits_are_the_c_modules() -> None:
    """Python's limits on a recipe (what define_op and `recipe` refuse past) are the ones the C module was built with
    (launcher_api.h, which the replays' C++ reads too)."""
    mod = launcher.module()
    if mod is None:
        pytest.fail("the launcher's C module did not build")
    assert (launcher.MAX_STEPS, launcher.MAX_OUTPUTS) == (mod.MAX_STEPS, mod.MAX_OUTPUTS)


def test_a_calls_key_splits_what_a_forward_may_choose_by() -> None:
    """Dtype, device, alignment, shape, strides and each option's value make the key; only the address past its
    16-byte alignment does not. Arguments it cannot key (a CPU tensor, an object) give None."""
    R = c_replayer()
    x = CallTensor(torch.float32, 4096, (3, 11008), (11008, 1))

    def key(t: object = x, *options: object) -> bytes | None:
        return R.key(t, *(options or ("tanh",)))

    base = key()
    assert base is not None and key(CallTensor(torch.float32, 8192, (3, 11008), (11008, 1))) == base
    others = [
        key(CallTensor(torch.bfloat16, 4096, (3, 11008), (11008, 1))),
        key(CallTensor(torch.float32, 4100, (3, 11008), (11008, 1))),
        key(CallTensor(torch.float32, 4096, (3, 11008), (11008, 1), device=1)),
        key(CallTensor(torch.float32, 4096, (3, 11007), (11008, 1))),
        key(CallTensor(torch.float32, 4096, (3, 11008), (11009, 1))),
        key(x, "none"),
        key(x, True),
        key(x, 1),
        key(x, 1.0),
        key(x, None),
    ]
    assert base not in others and len(set(others)) == len(others)
    assert R.key(torch.randn(3), "tanh") is None and R.key(object()) is None
    key = R.key(x, "tanh")
    assert R.replay(x, "tanh") == key and R.size() == 0  # no recipe: the caller runs forward, recorded
    R.refuse(key)
    assert R.replay(x, "tanh") is None and R.size() == 0  # refused: the caller runs forward, unrecorded


def test_a_users_call_is_keyed_as_replay_keys_it_and_left_to_python_where_it_must_be() -> None:
    """call(args, kwargs): positional arguments keyed as replay() keys them, each option given by keyword a key of
    its own (name and value). None: a tensor of a subclass or requiring grad, a tensor by keyword, replays switched
    off, within a recording, a refused key. Its own misuse is a TypeError."""
    R = c_replayer()
    x = CallTensor(torch.float32, 4096, (3, 11008), (11008, 1))
    assert R.call((x, "tanh"), {}) == R.key(x, "tanh")
    by_name = R.call((x,), {"approximate": "tanh"})
    assert type(by_name) is bytes and by_name not in (R.key(x, "tanh"), R.call((x,), {"form": "tanh"}))
    assert R.call((x,), {"approximate": "none"}) != by_name

    class Sub(CallTensor):
        pass

    grad = CallTensor(torch.float32, 4096, (3, 11008), (11008, 1))
    grad.requires_grad = True
    assert R.call((Sub(torch.float32, 4096, (3,), (1,)), "tanh"), {}) is None
    assert R.call((grad, "tanh"), {}) is None and R.replay(grad, "tanh") == R.key(x, "tanh")
    assert R.call((x,), {"other": x}) is None
    with launcher.enabled(False):
        assert R.call((x, "tanh"), {}) is None
    with launcher.recording():
        assert R.call((x, "tanh"), {}) is None
    assert R.call((x, "tanh"), {}) == R.key(x, "tanh")
    R.refuse(by_name)
    assert R.call((x,), {"approximate": "tanh"}) is None
    with pytest.raises(TypeError, match="call"):
        R.call(x, {})


class Launched:
    """A launch's C Launcher as `recipe` reads it: a binary, and 8 bytes of values per argument (its descriptors'
    past them, in the C module's; none here)."""

    def binary(self, device, *args):
        return "binary"

    def values(self, device, *args):
        return b"v" * 8 * len(args)


def as_if_on_gpu(monkeypatch, make_recipe) -> None:
    """CPU tensors standing for CUDA ones (is_cuda, device 0), and the C module's Recipe made by `make_recipe`."""
    monkeypatch.setattr(launcher, "module", lambda: SimpleNamespace(Recipe=make_recipe))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda t: 0)


def test_a_recipe_maps_each_launched_pointer_to_an_input_or_an_output(monkeypatch) -> None:
    """recipe(): every tensor a launch was given (or a descriptor's base) is an input or an output, by address; the
    outputs are allocated as the call's were (shape, dtype number, strides: a dense output in another order of its
    dimensions keeps that order). A tensor made per call, a launch left to Triton, an output with gaps or overlaps,
    an output torch wrote in place or two tensors at one address: no recipe."""
    made = []

    def made_recipe(device, outputs, steps, keep, stream, options):
        assert (keep, stream) == ((), 0)  # no workspace: nothing held, any stream
        assert options == ("tanh",)  # the call's options, for the C++ autograd's backward
        made.append((device, outputs, steps))
        return "recipe"

    as_if_on_gpu(monkeypatch, made_recipe)
    x, out = torch.randn(5), torch.empty(5)  # CPU tensors standing for CUDA ones: their addresses are read

    def noted(*launch_args: object, replayable: bool = True) -> launcher.Recording:
        rec = launcher.Recording()
        rec.note(Launched(), (5,), launch_args, 0)
        if not replayable:
            rec.mark_not_replayable()
        return rec

    assert launcher.recipe((x, "tanh"), out, noted(x, out, 17, 17, 1)) == "recipe"
    device, outputs, steps = made[-1]
    assert (device, outputs) == (0, (((5,), launcher.NUMBERS[torch.float32], (1,)),))
    assert steps == (("binary", (5, 1, 1), b"v" * 40, ((0, 0), (1, -1))),)
    per_call = torch.empty(1)
    assert launcher.recipe((x, "tanh"), out, noted(x, out, per_call)) is None
    assert launcher.recipe((x, "tanh"), out, noted(x, out, replayable=False)) is None
    assert launcher.recipe((x, "tanh"), out.expand(5, 5).t(), noted(x, out)) is None  # overlapping
    assert launcher.recipe((x, "tanh"), torch.empty(5, 6)[:, :5], noted(x, out)) is None  # gaps between rows
    permuted = torch.empty(7, 3, 5).permute(1, 0, 2)  # (3, 7, 5) laid out as (7, 3, 5): dense, not contiguous
    assert launcher.recipe((x, "tanh"), permuted, noted(x, permuted)) == "recipe"
    assert made[-1][1] == (((3, 7, 5), launcher.NUMBERS[torch.float32], (5, 15, 1)),)
    assert launcher.recipe((x, "tanh"), x, noted(x)) is None  # an output at an input's address
    zeroed = torch.empty(5)
    zeroed[3:].zero_()  # rows torch wrote, not a launch: a replay would leave them as the allocator left them
    assert launcher.recipe((x, "tanh"), zeroed.view(5, 1), noted(x, zeroed)) is None
    from triton.tools.tensor_descriptor import TensorDescriptor

    o, lse = torch.empty(3, 64, dtype=torch.bfloat16), torch.empty(3)
    q = torch.randn(3, 64, dtype=torch.bfloat16)
    q_desc, o_desc = (TensorDescriptor.from_tensor(t, [16, 64]) for t in (q, o))
    assert launcher.recipe((q, "tanh"), (o, lse), noted(q_desc, None, o_desc, lse, 3)) == "recipe"
    device, outputs, steps = made[-1]
    assert outputs == (
        ((3, 64), launcher.NUMBERS[torch.bfloat16], (64, 1)),
        ((3,), launcher.NUMBERS[torch.float32], (1,)),
    )
    assert steps[0][3] == ((0, 0), (2, -1), (3, -2))  # the descriptors' bases patched as pointers are


def test_a_workspace_is_kept_per_name_dtype_and_device_and_fresh_while_tracing() -> None:
    """workspace(): zeros, the same buffer for the same name, dtype and device (grown when too small, the old one kept
    for what holds it), another for another name; while torch traces, fresh zeros every call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    cpu = torch.device("cpu")
    a = launcher.workspace("test a", 5, torch.int32, cpu)
    assert a.numel() == 5 and not a.any()
    a.fill_(7)
    assert launcher.workspace("test a", 3, torch.int32, cpu).data_ptr() == a.data_ptr()
    assert launcher.workspace("test b", 3, torch.int32, cpu).data_ptr() != a.data_ptr()
    assert launcher.workspace("test a", 3, torch.float32, cpu).data_ptr() != a.data_ptr()
    grown = launcher.workspace("test a", 9, torch.int32, cpu)
    assert grown.numel() == 9 and grown.data_ptr() != a.data_ptr() and not grown.any()
    assert launcher._HELD[a.data_ptr()][0].data_ptr() == a.data_ptr()  # the old one, still held

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        fresh = launcher.workspace("test a", 9, torch.int32, cpu)
    assert fresh.data_ptr() != grown.data_ptr() and fresh.data_ptr() not in launcher._HELD


def test_a_workspace_of_scratch_is_not_zeroed_while_tracing() -> None:
    """While torch traces (or a CUDA graph is captured), a fresh workspace of counters (zeros=True) is made of zeros
    and one of scratch (zeros=False, written before it is read) is only allocated: no fill for a graph to run at
    every replay. Kept buffers of scratch are the same buffer call after call, as counters' are, and apart from a
    buffer of zeros of the same name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Noting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    cpu = torch.device("cpu")
    with Noting() as counters:
        zeroed = launcher.workspace("test counters", 17, torch.int32, cpu)
    with Noting() as scratch:
        launcher.workspace("test scratch", 17, torch.float32, cpu, zeros=False)
    assert not zeroed.any() and any("zero" in op or "fill" in op for op in counters.ops), counters.ops
    assert scratch.ops and all(op.startswith("empty") for op in scratch.ops), scratch.ops
    kept = launcher.workspace("test scratch", 5, torch.float32, cpu, zeros=False)
    assert launcher.workspace("test scratch", 5, torch.float32, cpu, zeros=False).data_ptr() == kept.data_ptr()
    kept.fill_(3.0)  # a name asked for with zeros too gets zeros, not the scratch
    asked = launcher.workspace("test scratch", 5, torch.float32, cpu)
    assert asked.data_ptr() != kept.data_ptr() and not asked.any()


def test_a_recipe_keeps_a_workspaces_address_and_holds_it_on_its_stream(monkeypatch) -> None:
    """A launch given part of a workspace: its address stays in the values (no patch), the recipe holds the buffer
    and runs on the buffer's stream only."""
    made = []
    as_if_on_gpu(monkeypatch, lambda *parts: made.append(parts) or "recipe")
    x, out = torch.randn(5), torch.empty(5)
    buffer = torch.zeros(8)
    monkeypatch.setitem(launcher._HELD, buffer.data_ptr(), (buffer, 1234))
    rec = launcher.Recording()
    rec.note(Launched(), (5,), (x, out, buffer[:4], buffer[4:]), 0)
    assert launcher.recipe((x,), out, rec) == "recipe"
    steps, keep, stream, options = made[-1][2:]
    assert steps[0][3] == ((0, 0), (1, -1)) and keep == (buffer,) and stream == 1234 and options == ()


def test_the_c_module_gives_its_api_to_the_cpp_replays() -> None:
    """The C module's `api` capsule (launcher_api.h) is what the replays' C++ extension runs recipes through."""
    mod = launcher.module()
    if mod is None:
        pytest.fail("the launcher's C module did not build")
    assert type(mod.api).__name__ == "PyCapsule" and "fuselab_launcher.api" in repr(mod.api)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("op", "shape", "dtype"),
    [("gelu", (4096,), torch.float32), ("gelu", (3, 11008), torch.bfloat16), ("gelu", (1,), torch.float32),
     ("softmax", (64, 1000), torch.float32), ("softmax", (37, 325), torch.bfloat16),
     ("softmax", (1, 1), torch.float32)],
)  # fmt: skip
def test_gpu_replayed_calls_give_the_forwards_results_bitwise(op: str, shape: tuple, dtype: torch.dtype) -> None:
    """The second call of a key replays from C (forward is not run: it would raise) and gives what forward gives;
    a misaligned view is a key of its own."""
    from fuselab.ops import get_op

    fused = get_op(op).get_impl("triton").fn
    x = torch.randn(shape, device="cuda", dtype=dtype)
    first = fused(x)
    assert fused._replayer is not None and fused._replayer.size() >= 1
    forward = fused._forward
    try:
        fused._forward = lambda *args: pytest.fail("forward ran: not replayed")
        again = fused(x)
    finally:
        fused._forward = forward
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    with launcher.enabled(False):
        torch.testing.assert_close(fused(x), first, rtol=0, atol=0)
    flat = torch.randn(x.numel() + 1, device="cuda", dtype=dtype)
    shifted = flat[1:].view(shape)  # 2 or 4 bytes past 16-byte alignment
    for _ in range(2):
        torch.testing.assert_close(fused(shifted), fused._forward(shifted, *fused._defaults[1:]), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("op", "shape", "dtype"),
    [("gelu", (4096,), torch.float32), ("gelu", (3, 11008), torch.bfloat16), ("softmax", (64, 1000), torch.float32),
     ("softmax", (37, 325), torch.bfloat16)],
)  # fmt: skip
def test_gpu_replayed_gradients_are_the_backwards_bitwise(op: str, shape: tuple, dtype: torch.dtype) -> None:
    """Under autograd, forward and backward are replayed too once recorded (backward is not run: it would raise),
    giving what Triton's own launches give."""
    from fuselab.ops import get_op

    fused = get_op(op).get_impl("triton").fn
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    with launcher.enabled(False):
        want_y = fused(x)
        (want,) = torch.autograd.grad(want_y, x, dy)
    fused(x).backward(dy)  # records forward and backward
    backward = fused._backward
    try:
        fused._backward = lambda *args: pytest.fail("backward ran: not replayed")
        y = fused(x)
        (got,) = torch.autograd.grad(y, x, dy)
    finally:
        fused._backward = backward
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("op", "shape", "dtype"), [("gelu", (3, 11008), torch.bfloat16), ("softmax", (37, 325), torch.float32)]
)
def test_gpu_the_cpp_autograd_takes_a_grad_call_whole(op: str, shape: tuple, dtype: torch.dtype) -> None:
    """With the replays' C++ extension, a call needing grad is taken by the C entry once its key is recorded: the
    output's grad_fn is the C++ Function, no Python of the op runs forward or backward, and results and gradients are
    the Python path's bitwise. A sum's gradient (expanded: stride 0), no_grad, and an in-place change of what
    backward saved behave as autograd does."""
    from fuselab.ops import get_op

    if launcher.replays_module() is None:
        pytest.fail("the replays' C++ extension did not build")
    fused = get_op(op).get_impl("triton").fn
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)
    with launcher.enabled(False):
        want_y = fused(x)
        (want,) = torch.autograd.grad(want_y, x, dy)
        (want_sum,) = torch.autograd.grad(fused(x).sum(), x)
    torch.autograd.grad(fused(x), x, dy)  # records forward and backward
    parts = fused._forward, fused._backward, fused._check
    try:
        fused._forward = fused._backward = fused._check = lambda *args: pytest.fail("the op's Python ran")
        y = fused(x)
        (got,) = torch.autograd.grad(y, x, dy)
    finally:
        fused._forward, fused._backward, fused._check = parts
    assert "ReplayFunction" in y.grad_fn.name() and fused._replayer.backward_size() >= 1
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for _ in range(2):  # the sum's gradient is refused a recipe (backward copies it): Python runs it, right
        (got_sum,) = torch.autograd.grad(fused(x).sum(), x)
        torch.testing.assert_close(got_sum, want_sum, rtol=0, atol=0)
    with torch.no_grad():
        assert fused(x).grad_fn is None
    inner = x * 1
    y = fused(inner)
    (inner if op == "gelu" else y).add_(1)  # what backward saved: GELU's input, softmax's output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(dy)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dtype"), [((2, 300_000), torch.float32), ((61, 50257), torch.bfloat16),
                                              ((5, 65536), torch.bfloat16)])  # fmt: skip
def test_gpu_a_call_with_a_workspace_is_replayed_on_its_stream(shape: tuple, dtype: torch.dtype) -> None:
    """Softmax's split plan (a few very wide rows: a vocabulary) keeps its workspace per stream: its calls are
    replayed (forward is not run: it would raise), bitwise what forward gives, the counters left zeros; on another
    stream the recipe, recorded on the default stream (whose handle is 0), is not used: forward runs, right."""
    from fuselab.ops import get_op

    fused = get_op("softmax").get_impl("triton").fn
    x = torch.randn(shape, device="cuda", dtype=dtype)
    want = fused(x)
    assert fused._replayer is not None
    forward = fused._forward
    try:
        fused._forward = lambda *args: pytest.fail("forward ran: not replayed")
        for _ in range(3):
            torch.testing.assert_close(fused(x), want, rtol=0, atol=0)
    finally:
        fused._forward = forward
    stream = torch._C._cuda_getCurrentRawStream(x.device.index)
    sync = launcher._WORKSPACES[("softmax split sync", torch.int32, x.device, stream, True)]
    assert not sync.any()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    runs = []
    try:
        fused._forward = lambda *args: runs.append(1) or forward(*args)
        with torch.cuda.stream(side):
            for _ in range(2):
                torch.testing.assert_close(fused(x), want, rtol=0, atol=0)
    finally:
        fused._forward = forward
    torch.cuda.current_stream().wait_stream(side)
    assert len(runs) == 2  # the recipe (recorded on the default stream, handle 0) is not replayed on another
    torch.testing.assert_close(torch.softmax(x.float(), -1).to(dtype), want, rtol=2e-2, atol=1e-5)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_gpu_a_recipe_with_a_workspace_is_not_replayed_while_its_stream_captures() -> None:
    """A recipe keeping a workspace (softmax's split plan), recorded on a side stream, is not replayed by the C entry
    while that stream captures a CUDA graph (the graph would share the eager calls' counters): the capture runs
    forward, with buffers of the graph's own, and records nothing. Eager calls between the graph's replays are
    replayed again, and both are right. (The registered op's path: test_softmax's captured-call test.)"""
    from fuselab.ops import get_op

    fused = get_op("softmax").get_impl("triton").fn
    x = torch.randn((2, 300_001), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # recorded, then replayed, on the side stream
            fused(x)
    forward = fused._forward
    runs = []
    try:
        fused._forward = lambda *args: runs.append(1) or forward(*args)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            y_graph = fused(x)
        assert len(runs) == 1  # forward ran in the capture
        for _ in range(3):
            x.normal_()
            graph.replay()
            with torch.cuda.stream(side):
                y_eager = fused(x)
            torch.cuda.synchronize()
            want = torch.softmax(x.double(), -1)
            torch.testing.assert_close(y_graph.double(), want, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(y_eager.double(), want, rtol=1e-5, atol=1e-7)
        assert len(runs) == 1  # the eager calls on the side stream were replayed
    finally:
        fused._forward = forward


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 80, 96, 128])
def test_gpu_tma_kernels_launch_from_c_with_tritons_results(d: int) -> None:
    """Attention's 16-bit kernels take TMA descriptors: from a key's second call they launch from C (the binary
    registered for the descriptors' key, each CUtensorMap encoded by the C module), and O, L, dQ, dK and dV are
    Triton's own launches' bitwise, at head dims in one chunk and in two (80, 96), GQA, causal, ragged lengths."""
    from fuselab.ops.attention import triton_kernels as tk

    gen = torch.Generator(device="cpu").manual_seed(d)
    q, do = (torch.randn(2, 4, 77, d, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 2, 130, d, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    assert tk.tma_ready(q, k, v)
    with launcher.enabled(False):
        o, lse = tk.forward(q, k, v, True, d**-0.5)
        want = (o, lse, *tk.backward(do, q, k, v, o, lse, True, d**-0.5))
    for _ in range(2):  # the first call of each key registers its binary, the second launches it from C
        o, lse = tk.forward(q, k, v, True, d**-0.5)
        got = (o, lse, *tk.backward(do, q, k, v, o, lse, True, d**-0.5))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    dq_kernel = tk.attention_bwd_dq_ds_kernel if tk.stores_scores(d, 8, 77, 130) else tk.attention_bwd_dq_tma_kernel
    for kernel in (tk.attention_fwd_tma_kernel, tk.attention_bwd_dkdv_tma_kernel, dq_kernel):
        configs = launcher._FAST[kernel]._configs.values()
        assert any(c is not None and c.size() >= 1 for c in configs), kernel  # registered: launched from C


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("q_shape", "kv_shape", "dtype", "causal"),
    [((2, 3, 77, 80), (2, 3, 77, 80), torch.bfloat16, True), ((1, 4, 130, 64), (1, 2, 61, 64), torch.bfloat16, False),
     ((1, 16, 512, 64), (1, 16, 512, 64), torch.float16, True), ((3, 33, 64), (3, 47, 64), torch.float32, False),
     ((1, 2, 1, 96), (1, 2, 1, 96), torch.bfloat16, True), ((1, 2, 5, 64), (1, 2, 77, 64), torch.float16, True)],
)  # fmt: skip
def test_gpu_attention_calls_and_gradients_are_replayed_bitwise(
    q_shape: tuple, kv_shape: tuple, dtype: torch.dtype, causal: bool
) -> None:
    """Attention's forward (two outputs: O and the logsumexp) and backward (three, with scratch kept as workspaces,
    the split partials of few key blocks summed by a kernel) are replayed from a key's second call (neither runs its
    Python: it would raise), TMA descriptors re-encoded for the new addresses; O and the gradients are the Python
    path's bitwise. Covers TMA and pointer kernels, GQA, 3-D inputs, N = 1, a split dK/dV loop, and keys no query
    sees (top-left causal, 5 queries over 77 keys: their zeros written by a kernel, so replayed too)."""
    from fuselab.ops.attention.triton import attention_triton as fused  # the op itself (the registry wraps it)

    gen = torch.Generator(device="cpu").manual_seed(sum(q_shape))
    q = torch.randn(q_shape, generator=gen).to("cuda", dtype)
    k, v = (torch.randn(kv_shape, generator=gen).to("cuda", dtype) for _ in range(2))
    dy = torch.randn(q_shape, generator=gen).to("cuda", dtype)
    with launcher.enabled(False):
        want = fused(q, k, v, causal)
        xs = [t.clone().requires_grad_(True) for t in (q, k, v)]
        want_grads = torch.autograd.grad(fused(*xs, causal), xs, dy)
    first = fused(q, k, v, causal)
    torch.autograd.grad(fused(*xs, causal), xs, dy)  # records the completed call's forward, and the backward
    parts = fused._forward, fused._backward
    try:
        fused._forward = fused._backward = lambda *args: pytest.fail("the op's Python ran: not replayed")
        again = fused(q.clone(), k.clone(), v.clone(), causal)  # other addresses, one key
        grads = torch.autograd.grad(fused(*xs, causal), xs, dy)
    finally:
        fused._forward, fused._backward = parts
    assert fused._replayer.size() >= 2 and fused._backward_replayer.size() >= 1
    for got in (first, again):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    (summed,) = torch.autograd.grad(fused(xs[0], k, v, causal).sum(), xs[0])  # a broadcast gradient: copied, Python
    with launcher.enabled(False):
        (want_summed,) = torch.autograd.grad(fused(xs[0], k, v, causal).sum(), xs[0])
    torch.testing.assert_close(summed, want_summed, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "tokens", "heads", "d"), [(2, 77, 3, 80), (1, 130, 4, 64)])
def test_gpu_attention_on_views_of_one_projection_is_replayed_in_qs_layout(
    batch: int, tokens: int, heads: int, d: int
) -> None:
    """q, k, v sliced from one (B, N, 3, H, d) projection, as a GPT block makes them: O is laid out in q's order of
    dimensions (dense, not contiguous) and the forward is still replayed from a key's second call (its Python not
    run), O with the Python path's strides and values, bitwise; gradients through the views match too."""
    from fuselab.ops.attention.triton import attention_triton as fused

    gen = torch.Generator(device="cpu").manual_seed(batch * tokens + d)

    def projection() -> torch.Tensor:
        return torch.randn(batch, tokens, 3, heads, d, generator=gen).to("cuda", torch.bfloat16)

    def views(qkv: torch.Tensor) -> list[torch.Tensor]:
        return [t.transpose(1, 2) for t in qkv.unbind(2)]

    qkv, other = projection(), projection()
    with launcher.enabled(False):
        want, want_other = fused(*views(qkv), True), fused(*views(other), True)
        leaf = qkv.clone().requires_grad_(True)
        (want_grad,) = torch.autograd.grad(fused(*views(leaf), True).square().sum(), leaf)
    assert not want.is_contiguous() and want.transpose(1, 2).is_contiguous()  # O in q's order
    first = fused(*views(qkv), True)  # records the key's recipe
    forward = fused._forward
    try:
        fused._forward = lambda *args: pytest.fail("the op's Python ran: not replayed")
        again = fused(*views(other), True)
    finally:
        fused._forward = forward
    for got, expected in ((first, want), (again, want_other)):
        assert got.stride() == expected.stride()
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    leaf = qkv.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fused(*views(leaf), True).square().sum(), leaf)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)


@pytest.mark.gpu
def test_gpu_compiled_attention_is_replayed_from_a_keys_second_call() -> None:
    """Under torch.compile(fullgraph=True) the graph's calls of attention's forward and backward ops are replayed from
    C once a key is recorded (neither op's Python runs: it would raise), with the eager path's O and gradients
    bitwise, on inputs at other addresses."""
    from fuselab.ops.attention.triton import attention_triton as fused

    gen = torch.Generator(device="cpu").manual_seed(77)

    def make(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to("cuda", torch.bfloat16)

    q, k, v, dy = make(2, 6, 77, 80), make(2, 3, 91, 80), make(2, 3, 91, 80), make(2, 6, 77, 80)
    with launcher.enabled(False):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        want = fused(*leaves, True)
        want_grads = torch.autograd.grad(want, leaves, dy)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *ts: fused(*ts, True), fullgraph=True)
    for _ in range(2):  # compiles, then records each op's recipe
        torch.autograd.grad(compiled(*leaves), leaves, dy)
    parts = fused._forward, fused._backward
    try:
        fused._forward = fused._backward = lambda *args: pytest.fail("the op's Python ran: not replayed")
        others = [t.clone().requires_grad_(True) for t in (q, k, v)]
        got = compiled(*others)
        grads = torch.autograd.grad(got, others, dy.clone())
    finally:
        fused._forward, fused._backward = parts
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for g, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, expected, rtol=0, atol=0)


def test_a_kernel_the_launcher_does_not_wrap_makes_a_recording_not_replayable() -> None:
    """A launch site given something other than a plain @triton.jit kernel (a wrapper, an autotuner) launches it
    itself, unseen by the recording: the recording is marked not replayable, so no recipe skips that launch."""

    class Wrapper:
        def __getitem__(self, grid: object) -> object:
            return lambda *args: None

    wrapper = Wrapper()
    with launcher.recording() as noted:
        assert launcher.fast(wrapper) is wrapper
    assert not noted.replayable
    assert launcher.fast(wrapper) is wrapper  # outside a recording: just the kernel


def test_a_recording_notes_this_threads_launches_within_it() -> None:
    """recording() notes this thread's launches; within it recording_now() says so (a fused op inside a recorded
    forward runs its own forward, so the outer recording sees every launch); after it, nothing is noted."""
    assert not launcher.recording_now()
    with launcher.recording() as outer:
        assert launcher.recording_now()
        outer.note(object(), (3,), (), 0)
        outer.mark_not_replayable()
    assert not launcher.recording_now()
    assert len(outer.launches) == 1 and not outer.replayable
