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


def _as_triton_arg(v: object) -> object:
    """A TensorLike as the torch tensor Triton would see (its specialization reads data_ptr() and dtype)."""
    if not isinstance(v, TensorLike):
        return v
    return SimpleNamespace(data_ptr=v.data_ptr, dtype=v.dtype)


def test_arguments_the_launcher_cannot_pass_go_to_triton() -> None:
    """launch() answers None (stay with Triton) for a CPU tensor, an unknown object, a dtype it does not number, a
    grid that is not 1 to 3 ints, and False (no binary yet) for what it can pass; nothing is launched either way."""
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
    assert L.launch((4, 2), 0, 0, arg, 7, 0.5, True, None) is False
    assert L.launch([4], 0, 0, arg, 7, 0.5, True, None) is False
    assert L.size() == 0


def test_add_checks_the_layout() -> None:
    L = c_launcher()
    key = L.key(0, TensorLike(torch.float32, 64), 7)
    with pytest.raises(ValueError, match="one char per argument"):
        L.add(key, 0, 4, 0, "p")
    with pytest.raises(ValueError, match="unknown layout"):
        L.add(key, 0, 4, 0, "pz")
    L.add(key, 0, 4, 0, "pi")
    assert L.size() == 1


def _compiled(signature: dict, metadata: dict | None = None) -> SimpleNamespace:
    """A stand-in for Triton's CompiledKernel: src.fn.arg_names, src.signature, src.constants, metadata."""
    md = {"num_ctas": 1, "launch_cooperative_grid": False, "launch_pdl": False, "global_scratch_size": 0}
    md.update(profile_scratch_size=0, tensordesc_meta=None, num_warps=4, shared=0, **(metadata or {}))
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
    assert len(configs) == 1 and configs[0].launcher.size() >= 8  # n classes x dtypes x alignment x negate


@pytest.mark.gpu
def test_gpu_a_cpu_tensor_gets_tritons_error_not_a_launch() -> None:
    fast = launcher.FastKernel(_scale_kernel)
    x = torch.randn(64, device="cuda")
    fast[(1,)](x, torch.empty_like(x), 64, 1.0, False, BLOCK=64)
    with pytest.raises(Exception, match=r"(?i)pointer|cpu|device"):
        fast[(1,)](x.cpu(), torch.empty_like(x), 64, 1.0, False, BLOCK=64)
    torch.cuda.synchronize()
