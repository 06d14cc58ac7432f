"""The op factory (fuselab.ops.library.define_op) on a toy op shaped like attention: two tensor inputs, bool, float
and str options, a forward that also returns a tensor kept for backward only, a backward with two gradients.
GPU tests, on every registered impl that is a FusedOp: one call makes no host sync and launches only kernels of the
impl's own (a forward one), and compiled graphs launch them too."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
import torch

import fuselab  # noqa: F401  (TRITON_INTERPRET=1 without a GPU, before any kernel is defined)
from fuselab.bench.accuracy import relative_error as rel_err
from fuselab.ops.library import FusedOp, define_op
from fuselab.ops.registry import Op, all_ops

CALLS = {"forward": 0, "backward": 0}


def toy_forward(
    a: torch.Tensor, b: torch.Tensor, flip: bool, scale: float, mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """out = scale * a * b (negated when flip; tanh'd when mode == 'tanh'); extra: a * b, kept for backward."""
    CALLS["forward"] += 1
    prod = a * b
    pre = (-scale if flip else scale) * prod
    return (torch.tanh(pre) if mode == "tanh" else pre.clone()), prod


def toy_backward(
    dout: torch.Tensor, a: torch.Tensor, b: torch.Tensor, prod: torch.Tensor, flip: bool, scale: float, mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS["backward"] += 1
    s = -scale if flip else scale
    g = dout * s * ((1 - torch.tanh(s * prod) ** 2) if mode == "tanh" else 1.0)
    return g * b, g * a


def toy_fake(
    a: torch.Tensor, b: torch.Tensor, flip: bool, scale: float, mode: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(a), torch.empty_like(a)


def toy_backward_fake(dout, a, b, prod, flip, scale, mode):
    return torch.empty_like(a), torch.empty_like(b)


def toy_check(a: torch.Tensor, b: torch.Tensor, flip: bool, scale: float, mode: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"toy: a {tuple(a.shape)} and b {tuple(b.shape)} must have one shape")
    if mode not in ("linear", "tanh"):
        raise ValueError(f"toy: mode={mode!r}; accepted: 'linear', 'tanh'")


TOY_PARTS = {
    "fake": toy_fake,
    "backward": toy_backward,
    "backward_fake": toy_backward_fake,
    "outputs": ("out",),
    "extras": ("prod",),
    "check": toy_check,
}
TOY = define_op("test_library_toy", toy_forward, **TOY_PARTS)
TOY_VIA_OP = define_op("test_library_toy_op", toy_forward, **TOY_PARTS, direct=False)
TOY_DEFAULTS = define_op(
    "test_library_toy_defaults", toy_forward, **TOY_PARTS, defaults={"scale": 1.0, "mode": "linear"}
)


def reference(a: torch.Tensor, b: torch.Tensor, flip: bool, scale: float, mode: str) -> torch.Tensor:
    pre = (-scale if flip else scale) * a * b
    return torch.tanh(pre) if mode == "tanh" else pre


def inputs(shape: tuple[int, ...] = (7, 13), seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64)


def test_schemas_are_inferred_from_the_functions() -> None:
    assert str(torch.ops.fuselab.test_library_toy.default._schema) == (
        "fuselab::test_library_toy(Tensor a, Tensor b, bool flip, float scale, str mode) -> (Tensor, Tensor)"
    )
    backward = str(torch.ops.fuselab.test_library_toy_backward.default._schema)
    assert backward.startswith("fuselab::test_library_toy_backward(Tensor dout, Tensor a, Tensor b, Tensor prod, bool")


@pytest.mark.parametrize("op", [TOY, TOY_VIA_OP], ids=["direct", "via-op"])
@pytest.mark.parametrize("mode", ["linear", "tanh"])
def test_forward_and_gradients_match_float64(op, mode: str) -> None:
    a, b = inputs((5, 11), seed=3)
    out = op(a, b, True, 0.7, mode)
    assert isinstance(out, torch.Tensor)  # extras are not returned
    assert rel_err(out, reference(a, b, True, 0.7, mode)) < 1e-12
    assert torch.autograd.gradcheck(lambda x, y: op(x, y, False, 1.3, mode), (a.requires_grad_(), b.requires_grad_()))


def test_options_by_keyword_with_defaults_and_converted_types() -> None:
    """A fused op is called as its impl is: options by keyword or left at their defaults (its signature says which),
    bool and float options converted as the schema needs; a missing or unknown argument is a TypeError."""
    a, b = inputs((4, 9), seed=5)
    assert str(inspect.signature(TOY_DEFAULTS)) == (
        "(a: torch.Tensor, b: torch.Tensor, flip: bool, scale: float = 1.0, mode: str = 'linear')"
    )
    expected = reference(a, b, True, 1.0, "linear")
    assert torch.equal(TOY_DEFAULTS(a, b, True), expected)
    assert torch.equal(TOY_DEFAULTS(a, b, flip=1, scale=1), expected)  # 1 -> True, 1 -> 1.0
    assert torch.equal(TOY_DEFAULTS(a, b, True, mode="tanh", scale=0.5), reference(a, b, True, 0.5, "tanh"))
    z = TOY_VIA_OP(a, b, flip=0, scale=2, mode="linear")  # through the dispatcher: the schema's types
    assert torch.equal(z, reference(a, b, False, 2.0, "linear"))
    with pytest.raises(TypeError, match="flip"):
        TOY_DEFAULTS(a, b)
    with pytest.raises(TypeError, match="colour"):
        TOY_DEFAULTS(a, b, True, colour="red")
    with pytest.raises(ValueError, match="trailing"):
        define_op("test_library_toy_bad", toy_forward, fake=toy_fake, defaults={"flip": False})


def test_eager_path_skips_the_dispatcher_and_tracing_uses_the_op() -> None:
    """Eager calls run forward directly (no grad) or through the autograd.Function (grad); fake tensors and
    torch.compile go through the registered op."""
    a, b = inputs()
    CALLS.update(forward=0, backward=0)
    TOY(a, b, False, 1.0, "linear")
    assert CALLS["forward"] == 1
    y = TOY(a.requires_grad_(), b, False, 1.0, "tanh")
    assert type(y.grad_fn).__name__ == "TestLibraryToyBackward"
    y.sum().backward()
    assert CALLS == {"forward": 2, "backward": 1}
    z = TOY_VIA_OP(a, b, False, 1.0, "tanh")
    assert "TestLibraryToy" not in type(z.grad_fn).__name__  # the op's own autograd node

    from torch._subclasses.fake_tensor import FakeTensorMode

    before = CALLS["forward"]
    with FakeTensorMode():
        fa, fb = torch.empty(3, 4), torch.empty(3, 4)
        out = TOY(fa, fb, True, 2.0, "tanh")
        assert out.shape == (3, 4) and CALLS["forward"] == before  # the fake ran, not forward
        with pytest.raises(ValueError, match="must have one shape"):
            TOY(fa, torch.empty(4, 3), True, 2.0, "tanh")


def test_an_autograd_of_its_own_is_called_when_gradients_are_needed() -> None:
    """`autograd` (a CUDA impl's C++ Function; a differentiable function here) replaces the Python Function in the
    eager path with gradients; without them forward runs directly; compiled code and ops keep the backward op. An
    autograd without a backward is refused."""
    seen = []

    def own_autograd(a, b, flip, scale, mode):
        seen.append(mode)
        return reference(a, b, flip, scale, mode)

    toy = define_op("test_library_toy_own_autograd", toy_forward, **TOY_PARTS, autograd=own_autograd)
    a, b = inputs()
    toy(a, b, False, 2.0, "linear")
    assert seen == []
    leaf = a.clone().requires_grad_()
    y = toy(leaf, b, True, 2.0, "tanh")
    assert seen == ["tanh"] and "TestLibraryToy" not in type(y.grad_fn).__name__
    (grad,) = torch.autograd.grad(y.sum(), leaf)
    expected = a.clone().requires_grad_()
    (want,) = torch.autograd.grad(reference(expected, b, True, 2.0, "tanh").sum(), expected)
    assert rel_err(grad, want) < 1e-12
    with pytest.raises(ValueError, match="autograd needs the backward"):
        define_op("test_library_toy_bad_autograd", toy_forward, fake=toy_fake, autograd=own_autograd)


def test_replay_is_for_triton_impls_and_leaves_the_cpu_to_forward() -> None:
    """replay=True (Triton kernels replayed from C) is refused for CUDA impls; where nothing launches from C (the
    CPU, the interpreter) the op runs forward, every call, with the same results."""
    with pytest.raises(ValueError, match="replay is for Triton kernels"):
        define_op("test_library_toy_bad_replay", toy_forward, **TOY_PARTS, kind="cuda", replay=True)
    calls = []

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return a * b

    toy = define_op("test_library_toy_replay", product, fake=lambda a, b: torch.empty_like(a), kind="triton",
                    replay=True)  # fmt: skip
    a, b = inputs()
    first, second = toy(a, b), toy(a, b)
    assert len(calls) == 2 and torch.equal(first, second) and torch.equal(first, a * b)


class StandInReplayer:
    """A C Replayer's stand-in for the replay flow's tests: keyed by shape, no key for one element (None), a recipe
    being the output itself."""

    def __init__(self) -> None:
        self.held: dict[bytes, object] = {}
        self.refused: list[bytes] = []

    def replay(self, x, *options):
        key = None if x.shape[0] == 1 else f"{tuple(x.shape)}".encode()
        if key is None or key in self.refused:
            return None
        return self.held[key].clone() if key in self.held else key

    def call(self, args, kwargs):  # as the C entry: plain tensors not requiring grad
        x = args[0]
        return None if type(x) is not torch.Tensor or x.requires_grad else self.replay(*args)

    def add(self, key, recipe):
        self.held[key] = recipe

    def refuse(self, key):
        self.refused.append(key)


def stand_in_replays(monkeypatch) -> tuple[list[StandInReplayer], list, Callable, Callable]:
    """Replayers made as stand-ins (`made`, in order), no recipe for 5 elements (refused), and a forward and backward
    doubling their input, each run logged in `runs` (the forward's shape; ("backward", shape))."""
    from fuselab.ops import launcher, library

    made, runs = [], []
    monkeypatch.setattr(library, "_interpreted", lambda: False)
    monkeypatch.setattr(launcher, "new_replayer", lambda: made.append(StandInReplayer()) or made[-1])
    monkeypatch.setattr(launcher, "recipe", lambda args, out, noted: None if args[0].shape[0] == 5 else out)

    def double(x: torch.Tensor) -> torch.Tensor:
        runs.append(tuple(x.shape))
        return x * 2

    def double_backward(dy: torch.Tensor) -> torch.Tensor:
        runs.append(("backward", tuple(dy.shape)))
        return dy * 2

    return made, runs, double, double_backward


def test_replayed_calls_record_once_replay_after_and_refuse_what_no_recipe_redoes(monkeypatch) -> None:
    """The replay flow, forward and backward alike, over a stand-in C Replayer: a key without a recipe runs forward
    recorded and adds the recipe; a key whose recording makes none is refused (forward runs, unrecorded, and is not
    recorded again); a call without a key runs forward; later calls of a held key never run forward. Under CUDA graph
    capture a new key runs forward, neither recorded nor refused."""
    from fuselab.ops import launcher

    with pytest.raises(ValueError, match="at most 4 outputs"):
        define_op("test_library_toy_replay_five", toy_forward, fake=toy_fake, outputs=("a", "b", "c"),
                  extras=("d", "e"), kind="triton", replay=True)  # fmt: skip

    made, runs, double, double_backward = stand_in_replays(monkeypatch)
    toy = define_op("test_library_toy_replay_flow", double, fake=lambda x: torch.empty_like(x), kind="triton",
                    backward=double_backward, backward_fake=lambda dy: torch.empty_like(dy), replay=True)  # fmt: skip
    x3, x5, x1 = torch.randn(3), torch.randn(5), torch.randn(1)
    for _ in range(3):
        assert torch.equal(toy(x3), x3 * 2) and torch.equal(toy(x5), x5 * 2) and torch.equal(toy(x1), x1 * 2)
    assert runs == [(3,), (5,), (1,), (5,), (1,), (5,), (1,)]  # 3: recorded once; 5: refused; 1: no key
    forward_replayer = made[0]
    assert list(forward_replayer.held) == [b"(3,)"] and forward_replayer.refused == [b"(5,)"]
    runs.clear()
    monkeypatch.setattr(launcher, "capturing", lambda: True)  # a CUDA graph's capture: nothing recorded
    x7 = torch.randn(7)
    for _ in range(2):
        assert torch.equal(toy(x7), x7 * 2) and torch.equal(toy(x3), x3 * 2)
    assert runs == [(7,), (7,)]  # a held key still replays (the C module refuses those holding workspaces)
    assert list(forward_replayer.held) == [b"(3,)"] and forward_replayer.refused == [b"(5,)"]
    monkeypatch.setattr(launcher, "capturing", lambda: False)
    runs.clear()
    x = torch.randn(3, requires_grad=True)
    for _ in range(2):
        (g,) = torch.autograd.grad(toy(x), x, torch.ones(3))
        assert torch.equal(g, torch.full((3,), 2.0))
    assert runs == [("backward", (3,))]  # forward replayed both times, backward recorded once then replayed
    assert len(made) == 2 and list(made[1].held) == [b"(3,)"]


def test_the_registered_ops_calls_are_replayed_as_eager_ones_and_checked_where_they_run(monkeypatch) -> None:
    """A replay op's registered ops (what a compiled graph calls) replay as its eager calls do: a key's first call is
    checked, run recorded and its recipe added; later calls of the key are replayed, neither run nor checked; a
    refused key, a call without a key and replays switched off are checked and run every time; the backward op
    alike, by a Replayer of its own. Bad input still raises the check's error."""
    from fuselab.ops import launcher

    made, runs, double, double_backward = stand_in_replays(monkeypatch)
    checked = []

    def check(x: torch.Tensor) -> None:
        checked.append(tuple(x.shape))
        if x.dtype != torch.float32:
            raise ValueError("double: float32 only")

    toy = define_op("test_library_toy_op_replay", double, fake=lambda x: torch.empty_like(x), check=check,
                    backward=double_backward, backward_fake=lambda dy: torch.empty_like(dy), backward_check=check,
                    kind="python", replay=True)  # fmt: skip
    x3, x5, x1 = torch.randn(3), torch.randn(5), torch.randn(1)
    for _ in range(3):
        for x in (x3, x5, x1):
            assert torch.equal(toy.op(x), x * 2)
    assert runs == [(3,), (5,), (1,), (5,), (1,), (5,), (1,)]  # 3: recorded once; 5: refused; 1: no key
    assert checked == runs  # a replayed call is not checked
    assert list(made[0].held) == [b"(3,)"] and made[0].refused == [b"(5,)"]
    runs.clear(), checked.clear()
    with launcher.enabled(False):
        assert torch.equal(toy.op(x3), x3 * 2)
    assert runs == checked == [(3,)]
    runs.clear(), checked.clear()
    for _ in range(2):
        assert torch.equal(toy.backward_op(x3), x3 * 2)
    assert runs == [("backward", (3,))] and checked == [(3,)] and len(made) == 2 and list(made[1].held) == [b"(3,)"]
    with pytest.raises(ValueError, match="float32 only"):
        toy.op(x5.double())


def test_a_grad_call_the_c_entry_keys_is_recorded_then_handed_back_and_its_backward_recorded_by_key(monkeypatch):
    """Where the C entry keys a call needing grad (the C++ autograd's: `launcher.new_replays`), the Python path
    records forward under that key and calls the entry again, which takes it. The C++ autograd's backward, where it
    holds no recipe, is the op's `_c_backward`: run and recorded for the key it gives, or run alone without one,
    with forward's options as the recipe kept them."""
    from fuselab.ops import launcher, library

    class Entry:
        def __init__(self) -> None:
            self.held: dict[bytes, object] = {}
            self.backward: dict[bytes, object] = {}

        def call(self, args, kwargs):
            key = repr((tuple(args[0].shape), args[1:], sorted(kwargs.items()))).encode()
            if key not in self.held:
                return key
            return (args[0].detach() * 2).requires_grad_()  # stands for the C++ autograd's output

        def add(self, key, recipe):
            self.held[key] = recipe

        def refuse(self, key):
            pytest.fail("nothing here is refused")

        def add_backward(self, key, recipe):
            self.backward[key] = recipe

    entry, made, runs = Entry(), [], []
    monkeypatch.setattr(library, "_interpreted", lambda: False)
    monkeypatch.setattr(launcher, "new_replays", lambda *plan: made.append(plan) or entry)
    monkeypatch.setattr(launcher, "recipe", lambda args, out, noted: [a for a in args if type(a) is float])

    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        runs.append("forward")
        return x * scale

    def scaled_backward(dy: torch.Tensor, x: torch.Tensor, scale: float) -> torch.Tensor:
        runs.append("backward")
        return dy * scale

    toy = define_op("test_library_toy_c_autograd", scaled, fake=lambda x, s: torch.empty_like(x), kind="triton",
                    backward=scaled_backward, backward_fake=lambda dy, x, s: torch.empty_like(dy),
                    defaults={"scale": 2.0}, replay=True)  # fmt: skip
    x = torch.randn(3, requires_grad=True)
    y = toy(x)
    assert runs == ["forward"] and list(entry.held.values()) == [[2.0]] and y.requires_grad
    assert torch.equal(y, x.detach() * 2)
    tensor, saved_from, sources, backward = made[0]
    assert (tensor, tuple(saved_from), tuple(sources)) == (0, ((True, 0),), ((0, 0), (1, 0), (2, 0)))
    assert backward == toy._c_backward
    dy = torch.randn(3)
    assert torch.equal(backward(b"backward key", (2.0,), dy, (x.detach(),)), dy * 2)
    assert entry.backward == {b"backward key": [2.0]} and runs[-1] == "backward"
    assert torch.equal(backward(None, (3.0,), dy, (x.detach(),)), dy * 3) and len(entry.backward) == 1


def test_a_users_call_goes_to_the_c_entry_first_and_its_answers_steer_the_python_path(monkeypatch) -> None:
    """Once the first call made the replayer, a call is handed to its C entry (`call`) as the user made it: a held key
    returns without the check or forward; a key it holds nothing for (options by keyword make a key of their own) is
    recorded under that key after the check; None leaves the call to the Python path, which gives the check's
    errors. While torch.compile traces, the entry is never called; the compiled graph's call of the op is replayed."""
    from fuselab.ops import launcher, library

    class Entry:
        def __init__(self) -> None:
            self.held: dict[bytes, torch.Tensor] = {}
            self.calls: list[tuple] = []

        def call(self, args, kwargs):
            self.calls.append((len(args), tuple(kwargs)))
            x = args[0]
            assert type(x) is torch.Tensor and not torch.compiler.is_compiling(), "the entry was called while tracing"
            if x.requires_grad or x.shape[0] == 1:
                return None
            key = repr((tuple(x.shape), args[1:], sorted(kwargs.items()))).encode()
            return self.held.get(key, key)

        def replay(self, *args):
            return self.call(args, {})

        def add(self, key, recipe):
            self.held[key] = recipe

        def refuse(self, key):
            pytest.fail("nothing here is refused")

    entry = Entry()
    monkeypatch.setattr(library, "_interpreted", lambda: False)
    monkeypatch.setattr(launcher, "new_replayer", lambda: entry)
    monkeypatch.setattr(launcher, "recipe", lambda args, out, noted: out)
    checked, runs = [], []

    def check(x: torch.Tensor, scale: float) -> None:
        checked.append(scale)
        if scale < 0:
            raise ValueError("toy: scale must be >= 0")

    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        runs.append(scale)
        return x * scale

    toy = define_op("test_library_toy_entry", scaled, fake=lambda x, s: torch.empty_like(x), kind="triton",
                    check=check, defaults={"scale": 2.0}, replay=True)  # fmt: skip
    x = torch.randn(3)
    for _ in range(3):
        assert torch.equal(toy(x, 3.0), x * 3.0)
    assert runs == [3.0] and checked == [3.0]  # recorded by the first call under the entry's key, replayed after
    runs.clear(), checked.clear()
    for _ in range(3):
        assert torch.equal(toy(x, scale=3.0), x * 3.0) and torch.equal(toy(x), x * 2.0)
    assert runs == [3.0, 2.0] and checked == [3.0, 2.0]  # a key of their own each, recorded once
    assert (1, ("scale",)) in entry.calls and (1, ()) in entry.calls
    runs.clear(), checked.clear()
    one = torch.randn(1)
    for _ in range(2):
        assert torch.equal(toy(one, 3.0), one * 3.0)
    assert runs == [3.0, 3.0] and checked == [3.0, 3.0]  # the entry takes no such call: Python's path, every time
    with pytest.raises(ValueError, match="scale must be"):
        toy(x, -1.0)
    entry.calls.clear()
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: toy(t, 3.0) + 1, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x), x * 3.0 + 1)
    assert entry.calls == [(2, ())]  # the graph's call of the op, replayed (its arguments all positional)
    torch._dynamo.reset()


def test_a_cuda_impls_entry_is_made_by_its_first_direct_call() -> None:
    """fast= (kind "cuda"): made once, by the first call that runs forward directly; later calls go to it first,
    and its None leaves the call to forward. Other kinds are refused it."""
    made, taken, runs = [], [], []

    def entry(args, kwargs):
        taken.append(args[0].shape)
        return args[0] * 10 if args[0].shape[0] == 3 else None

    def forward(x: torch.Tensor) -> torch.Tensor:
        runs.append(x.shape)
        return x * 10

    with pytest.raises(ValueError, match="fast is for kind 'cuda'"):
        define_op("test_library_toy_bad_fast", forward, fake=lambda x: torch.empty_like(x), fast=lambda: entry)
    toy = define_op("test_library_toy_fast", forward, fake=lambda x: torch.empty_like(x), kind="cuda",
                    fast=lambda: made.append(1) or entry)  # fmt: skip
    x3, x4 = torch.randn(3), torch.randn(4)
    for _ in range(2):
        assert torch.equal(toy(x3), x3 * 10) and torch.equal(toy(x4), x4 * 10)
    assert made == [1] and runs == [(3,), (4,), (4,)] and taken == [(4,), (3,), (4,)]


def test_compiles_fullgraph_with_gradients() -> None:
    a, b = inputs((6, 9), seed=5)
    a32, b32 = a.float().requires_grad_(), b.float()
    torch._dynamo.reset()
    f = torch.compile(lambda x, y: TOY(x, y, True, 0.5, "tanh").sum(), fullgraph=True, backend="aot_eager")
    f(a32, b32).backward()
    a64 = a.clone().requires_grad_()
    reference(a64, b, True, 0.5, "tanh").sum().backward()
    assert rel_err(a32.grad, a64.grad) < 1e-6
    torch._dynamo.reset()


def test_opcheck() -> None:
    a, b = inputs((4, 6), seed=9)
    torch.library.opcheck(torch.ops.fuselab.test_library_toy.default, (a.requires_grad_(), b, True, 0.5, "tanh"))


def test_definition_errors_are_clear() -> None:
    def no_annotation(x, flag: bool) -> torch.Tensor:
        return x.clone()

    with pytest.raises(ValueError, match="needs a type annotation"):
        define_op("test_library_bad1", no_annotation, fake=no_annotation)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def backward(dz: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # dz: no output named z
        return dz

    with pytest.raises(ValueError, match="backward parameter 'dz'"):
        define_op("test_library_bad2", forward, fake=forward, backward=backward, backward_fake=backward)
    with pytest.raises(ValueError, match="kind 'cpp'"):
        define_op("test_library_bad3", forward, fake=forward, kind="cpp")


# ---------------------------------------------------------------------------------------------- GPU


def _odd_shape(op: Op) -> tuple[int, ...]:
    """The op's check shape with the most odd dimensions above 1 (no empty one): sizes no tile divides."""
    shapes = [tuple(s) for s in op.defaults.check_shapes if s and all(s)]
    return max(shapes, key=lambda s: sum(d > 1 and d % 2 == 1 for d in s))


def _fused_cases() -> list:
    """(op, impl name, shape) for every registered impl whose function is a FusedOp (fuselab.ops.library)."""
    return [
        pytest.param(op, name, _odd_shape(op), id=f"{op.name}/{name}")
        for op in all_ops()
        for name, impl in op.impls.items()
        if isinstance(inspect.unwrap(impl.fn), FusedOp)
    ]


FUSED_CASES = _fused_cases()


def test_fused_cases_come_from_the_registry() -> None:
    """The GPU tests below run on every fused impl the registry holds: some exist, each case makes its inputs."""
    assert FUSED_CASES, "no registered impl is a FusedOp: the GPU tests of fused impls would run none"
    for case in FUSED_CASES:
        op, _, shape = case.values
        inputs = op.make_inputs(shape, torch.float32, "cpu", 0)
        assert inputs and all(t.is_floating_point() and t.numel() for t in inputs), case.id


def device_activities(prof: torch.profiler.profile) -> list[str]:
    """Names of what ran on the GPU (kernels, copies, memsets)."""
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def pytorch_activity(name: str) -> bool:
    """Whether a device activity is PyTorch's own: a copy, a memset or an ATen kernel (at::native::...)."""
    return name.startswith(("Memcpy", "Memset")) or "at::" in name


def _call(op: Op, impl: str) -> Callable[..., torch.Tensor]:
    """The impl's function with the op's default options."""
    fn, options = op.get_impl(impl).fn, op.default_options()
    return lambda *inputs: fn(*inputs, **options)


@pytest.mark.gpu
@pytest.mark.parametrize(("op", "impl", "shape"), FUSED_CASES)
def test_gpu_a_call_syncs_never_and_launches_only_its_kernel(op: Op, impl: str, shape: tuple[int, ...]) -> None:
    """No host sync; a forward launches one kernel of the impl's own, forward + backward (gradients of every floating
    input) only such kernels, at least two: no copy, memset or ATen kernel."""
    fn = _call(op, impl)
    inputs = op.make_inputs(shape, torch.float32, "cuda", 1)
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    wrt = [t for t in leaves if t.requires_grad]
    dy = torch.randn_like(fn(*inputs))
    out = fn(*leaves)
    torch.autograd.grad(out, wrt, dy)  # builds, compiles, warms
    torch.cuda.synchronize()
    if impl == "cuda":  # the extension's own C++ autograd, not a Python Function (whose nodes are BackwardCFunction)
        assert not isinstance(out.grad_fn, torch.autograd.function.BackwardCFunction), type(out.grad_fn)
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn(*inputs)
        torch.autograd.grad(fn(*leaves), wrt, dy)
        with torch.no_grad():
            fn(*leaves)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    forward = device_activities(prof)
    assert len(forward) == 1 and not pytorch_activity(forward[0]), forward
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(fn(*leaves), wrt, dy)
        torch.cuda.synchronize()
    both = device_activities(prof)
    assert len(both) >= 2 and not any(pytorch_activity(name) for name in both), both


@pytest.mark.gpu
@pytest.mark.parametrize(("op", "impl", "shape"), FUSED_CASES)
def test_gpu_compiled_graphs_call_the_kernels(op: Op, impl: str, shape: tuple[int, ...]) -> None:
    """fullgraph compile with and without CUDA graphs: the same values as eager, and the graph replays launch a
    kernel of the impl's own (one its eager forward launches)."""
    fn = _call(op, impl)
    inputs = op.make_inputs(shape, torch.float32, "cuda", 2)
    eager = fn(*inputs)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*inputs)
        torch.cuda.synchronize()
    own = {name for name in device_activities(prof) if not pytorch_activity(name)}
    assert own, device_activities(prof)
    for mode in ("max-autotune-no-cudagraphs", "reduce-overhead"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda *ts: fn(*[t * 1.0 for t in ts]), fullgraph=True, mode=mode)
        for _ in range(3):
            out = compiled(*inputs)
        assert rel_err(out, eager) < 1e-6, mode
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            compiled(*inputs)
            torch.cuda.synchronize()
        assert own & set(device_activities(prof)), (mode, own, device_activities(prof))
    torch._dynamo.reset()


@pytest.mark.gpu
@pytest.mark.parametrize(("op_name", "impl"), [("gelu", "cuda"), ("softmax", "cuda"), ("gelu", "triton"),
                                               ("softmax", "triton")])  # fmt: skip
def test_gpu_the_c_entry_gives_the_python_paths_results_and_errors(op_name: str, impl: str) -> None:
    """A call handed to the impl's C entry (options positional or by keyword) gives bitwise what the registered op
    gives, gradients too; a strided input the op's results (GELU's CUDA entry reads it in place, the others leave it
    to the Python path); what the entry does not take (another dtype or device, an unknown option) the Python path's
    errors."""
    from fuselab.ops import get_op

    fused = get_op(op_name).get_impl(impl).fn
    options = {"approximate": "tanh"} if op_name == "gelu" else {}
    x = torch.randn(37, 325, device="cuda", dtype=torch.bfloat16)
    want = fused.op(x, *options.values())
    for _ in range(3):
        assert torch.equal(fused(x, *options.values()), want) and torch.equal(fused(x, **options), want)
    assert fused._fast is not None
    assert torch.equal(fused._fast((x, *options.values()), {}), want)  # the entry itself answers
    leaf, via_op = x.clone().requires_grad_(), x.clone().requires_grad_()
    dy = torch.randn_like(x)
    for _ in range(2):
        (got,) = torch.autograd.grad(fused(leaf, **options), leaf, dy)
        (expected,) = torch.autograd.grad(fused.op(via_op, *options.values()), via_op, dy)
        assert torch.equal(got, expected)
    strided = torch.randn(325, 37, device="cuda", dtype=torch.bfloat16).t()
    if (op_name, impl) == ("gelu", "cuda"):  # its entry reads any layout in place, as the op does
        assert torch.equal(fused._fast((strided, "tanh"), {}), fused.op(strided, "tanh"))
    for _ in range(2):
        assert torch.equal(fused(strided, **options), fused.op(strided, *options.values()))
    with pytest.raises(TypeError, match="float64"):
        fused(x.double(), **options)
    with pytest.raises(ValueError, match="on cpu"):
        fused(x.float().cpu(), **options)
    if op_name == "gelu":
        with pytest.raises(ValueError, match="approximate"):
            fused(x, approximate="exact")
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["gelu", "softmax"])
def test_gpu_a_cuda_ops_autograd_on_cuda_tensors_is_the_extensions(op_name: str) -> None:
    """Once the extension is loaded, the registered op's autograd on CUDA tensors (how compiled code and the
    dispatcher call it) is its C++ AutogradCUDA kernel, giving the eager path's gradients bitwise, compiled too; its
    backward op has no derivative."""
    from fuselab.ops import get_op

    fused = get_op(op_name).get_impl("cuda").fn
    options = ("tanh",) if op_name == "gelu" else ()
    x = torch.randn(37, 325, device="cuda", requires_grad=True)
    dy = torch.randn_like(x)
    (want,) = torch.autograd.grad(fused(x, *options), x, dy)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"fuselab::{op_name}_cuda", "AutogradCUDA")
    y = fused.op(x, *options)
    assert "OpFunction" in y.grad_fn.name(), y.grad_fn.name()
    (got,) = torch.autograd.grad(y, x, dy, create_graph=False)
    assert torch.equal(got, want)
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: fused(t * 1.0, *options), fullgraph=True)
    for _ in range(2):
        (got,) = torch.autograd.grad(compiled(x), x, dy)
        assert torch.equal(got, want)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"(?i)not implemented|derivative"):
        (g,) = torch.autograd.grad(fused.op(x, *options), x, dy, create_graph=True)
        torch.autograd.grad(g.sum(), x)


def test_wrap_triton_wraps_only_while_torch_traces(monkeypatch) -> None:
    """A kernel launched in plain eager code (the CS336 Function, the tuner) is launched from C (fuselab's launcher;
    the kernel itself with the launcher off), never torch's traceable wrapper (whose higher-order op cost ~300 us a
    call on the H200); under a dispatch mode (how torch traces a triton_op's body) it is the wrapper, so
    torch.compile sees the kernel."""
    triton = pytest.importorskip("triton")
    from torch.utils._python_dispatch import TorchDispatchMode

    from fuselab.ops import launcher, library

    kernel = triton.runtime.jit.JITFunction(_noop_kernel)  # compiled-kernel kind even under the interpreter

    monkeypatch.setattr(library, "_interpreted", lambda: False)  # as on a GPU
    monkeypatch.setattr(launcher, "_current_device", lambda: 0)
    eager = library.wrap_triton(kernel)
    assert isinstance(eager, launcher.FastKernel) and eager.kernel is kernel
    with launcher.enabled(False):
        assert library.wrap_triton(kernel) is kernel

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        wrapped = library.wrap_triton(kernel)
    assert not isinstance(wrapped, launcher.FastKernel) and getattr(wrapped, "kernel", None) is kernel


def _noop_kernel(x):
    pass
