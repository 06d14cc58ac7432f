"""One factory for every fused impl: `define_op` turns an impl's forward and backward functions into a PyTorch
custom op (schema, fake, autograd) and a callable whose eager path costs the host as little as a call can.

What it builds, for name "gelu_triton":

- ``fuselab::gelu_triton`` and ``fuselab::gelu_triton_backward``, schemas inferred from the annotations of `forward`
  and `backward`, joined by ``register_autograd``, each with a fake impl, so torch.compile(fullgraph=True) traces a
  model using them without a graph break.
  kind "triton": registered with ``torch.library.triton_op``; the kernels are launched through `wrap_triton` (this
  module's, which torch recognizes), so torch.compile traces into the launcher, sees each Triton kernel, launches it
  from the compiled code and can capture it in a CUDA graph. Under Triton's CPU interpreter (TRITON_INTERPRET=1)
  kernels cannot be traced, so there the op is an opaque ``custom_op`` with the given fake.
  kind "cuda": a ``custom_op`` whose Python body (the CompositeExplicitAutograd kernel) calls the extension; the
  extension's binding registers its own kernels for the CUDA and AutogradCUDA dispatch keys (TORCH_LIBRARY_IMPL)
  when it is loaded, and from then on the dispatcher, compiled code's calls included, runs C++ alone for CUDA
  tensors (the AutogradCUDA kernel, a C++ autograd Function calling the two ops below autograd, takes precedence
  over the Autograd kernel that register_autograd gives the op in Python).
  kind "python": a plain ``custom_op`` on `forward` / `backward`.
- a :class:`FusedOp`, the function users call. In eager mode, on plain tensors and outside any tracing, it skips the
  dispatcher: first its C entry, where the impl has one (a Triton replay's `Replayer.call`, a CUDA extension's
  `fast`), takes the whole call; else without autograd it calls `forward` directly; with it, a
  ``torch.autograd.Function`` calling `forward` and `backward` directly (a custom op's Python autograd costs some 20
  us more a call). While torch.compile traces (or under a dispatch mode, or on tensor subclasses such as FakeTensor)
  it calls the registered op.

The functions, by convention (attention is the general case)::

    forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]   # (o, lse)
    backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, causal: bool, scale: float)
        -> tuple[Tensor, Tensor, Tensor]                                                          # (dq, dk, dv)
    define_op("attention_triton", forward, backward=backward, outputs=("o",), extras=("lse",), fake=..., ...)

`forward` takes tensors and options (bool, int, float, str) positionally and returns `outputs` then `extras` (saved
for backward, not returned to the user). `backward`'s parameters are matched by name: ``d<output>`` is the gradient
of that output; a name of a forward parameter, output or extra is that value, saved by the forward; a forward option
is passed on. It returns one gradient per tensor parameter of `forward`, in order.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from fuselab.ops import launcher

Kind = Literal["triton", "cuda", "python"]
KINDS = ("triton", "cuda", "python")
NAMESPACE = "fuselab"

_NULL_CONTEXT = contextlib.nullcontext()
_MISSING = object()  # an argument neither given nor defaulted


# ---------------------------------------------------------------------------------------------- launch-site helpers

try:  # torch >= 2.6: the switch triton_op flips off around its eager body
    from torch._library.triton import is_wrap_triton_enabled
except ImportError:  # pragma: no cover (older torch: wrapping is always on)

    def is_wrap_triton_enabled() -> bool:
        return True


def wrap_triton(kernel: object) -> object:
    """`kernel` (a @triton.jit function) as an impl's launcher must launch it: ``wrap_triton(k)[grid](...)``.

    While torch traces (torch.compile, or a dispatch mode such as the functional pass over a triton_op's body),
    torch.library.wrap_triton's traceable wrapper, so the launch becomes a node of the graph. Otherwise the kernel
    launched from C (`fuselab.ops.launcher.fast`: the binary Triton compiled, without Triton's Python per call);
    never torch's wrapper in plain eager code, even where torch leaves its switch on (a kernel launched outside a
    triton_op's eager body, as the CS336 autograd Function and the tuner do): there it would run the launch through
    a higher-order op, some 300 us more a call. Under the interpreter, the kernel itself.
    The name matters: torch finds the kernels of a triton_op by looking for calls named ``wrap_triton``.
    """
    if not launcher.tracing():
        return kernel if _interpreted() else launcher.fast(kernel)
    if _interpreted() or not is_wrap_triton_enabled():
        return kernel
    return torch.library.wrap_triton(kernel)


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """A context that makes `t`'s GPU the current one for a launch (Triton launches on the current device); a
    shared null context when it already is, or when `t` is not a plain CUDA tensor (a fake one, while tracing)."""
    if t.is_cuda and type(t) is torch.Tensor and t.get_device() != torch._C._cuda_getDevice():
        return torch.cuda.device(t.device)
    return _NULL_CONTEXT


@functools.cache
def _interpreted() -> bool:
    """TRITON_INTERPRET=1 (read once: Triton itself reads it when kernels are defined, at import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _triton_traceable() -> bool:
    """Whether kernels can be registered with triton_op: Triton installed and compiling (not interpreting)."""
    return importlib.util.find_spec("triton") is not None and not _interpreted()


# ---------------------------------------------------------------------------------------------- the factory


class FusedOp:
    """A fused impl as users call it: ``op(*args)`` with forward's arguments, positionally.

    Returns forward's `outputs` (one tensor, or a tuple when there are several); `extras` stay with autograd.
    Options may be given by keyword, and those with `defaults` left out: its signature (`inspect.signature`) is
    forward's with them, so an op registers it as an impl itself (``OP.impl("triton", ...)(fused_op)``). Options
    annotated bool, int or float (or float | None) are converted to that type, as the op's schema needs.
    Eager calls go to a C entry first where the impl has one (`replay`, `fast`): the whole call, Python's only frame
    this method's.
    Attributes: `name`; `op` / `backward_op`: the registered ops (``torch.ops.fuselab.<name>`` and its backward);
    `kind`; `direct`: whether the eager path may skip the dispatcher (False: always call the op).
    """

    def __init__(
        self,
        name: str,
        forward: Callable[..., object],
        *,
        fake: Callable[..., object],
        backward: Callable[..., object] | None,
        backward_fake: Callable[..., object] | None,
        outputs: Sequence[str],
        extras: Sequence[str],
        check: Callable[..., None] | None,
        backward_check: Callable[..., None] | None,
        kind: Kind,
        direct: bool,
        defaults: Mapping[str, object] | None = None,
        autograd: Callable[..., object] | None = None,
        replay: bool = False,
        fast: Callable[[], Callable[[tuple, dict], object] | None] | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"define_op {name}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if not outputs:
            raise ValueError(f"define_op {name}: an op needs at least one output")
        if (backward is None) != (backward_fake is None):
            raise ValueError(f"define_op {name}: give backward and backward_fake together, or neither")
        if autograd is not None and backward is None:
            raise ValueError(f"define_op {name}: autograd needs the backward too (compiled code differentiates it)")
        self._autograd = autograd
        if replay and kind == "cuda":
            raise ValueError(f"define_op {name}: replay is for Triton kernels launched through wrap_triton")
        self._replay = replay
        self._replayer = self._backward_replayer = None  # C Replayers of forward and backward, made on first use
        if fast is not None and (kind != "cuda" or replay):
            raise ValueError(f"define_op {name}: fast is for kind 'cuda' (a replay's C entry is its Replayer's)")
        # the eager call's C entry, (args, kwargs) -> output, or None / a replay key for the Python path: made on the
        # first direct call (`fast`, or the Replayer's `call`)
        self._fast: Callable[[tuple, dict], object] | None = None
        self._make_fast = fast if direct else None
        self.name, self.kind, self.direct = name, kind, direct
        self.__name__ = self.__qualname__ = name
        self.outputs, self.extras = tuple(outputs), tuple(extras)
        self._check = check
        self.input_spec = getattr(check, "input_spec", None)  # what `check` tests (the registry's test, if equal)
        signature = _signature(forward, name)
        annotations = [p.annotation for p in signature.parameters.values()]
        self._params = tuple(signature.parameters)
        self._tensor_idx = tuple(i for i, a in enumerate(annotations) if a is torch.Tensor)
        self._option_idx = tuple(i for i, a in enumerate(annotations) if a is not torch.Tensor)
        if not self._tensor_idx:
            raise ValueError(f"define_op {name}: forward takes no tensor (annotate its tensor parameters)")
        self.__signature__ = _with_defaults(signature, dict(defaults or {}), name)
        self._index = {name: i for i, name in enumerate(self._params)}
        self._defaults = tuple(  # _MISSING where forward's parameter has no default
            _MISSING if p.default is p.empty else p.default for p in self.__signature__.parameters.values()
        )
        self._coerce = tuple((i, c) for i in self._option_idx if (c := _coercer(annotations[i])) is not None)
        self._single = len(self.outputs) == 1 and not self.extras
        if replay and len(self.outputs) + len(self.extras) > launcher.MAX_OUTPUTS:
            raise ValueError(f"define_op {name}: replay allocates at most {launcher.MAX_OUTPUTS} outputs and extras")
        n_out = len(self.outputs)
        triton = kind == "triton"
        self._forward, self._backward = forward, backward  # outside tracing, wrap_triton launches directly

        body = _checked(forward, check)
        if replay:  # the registered op's calls (a compiled graph's) replayed as the eager ones are
            body = _replaying(forward, lambda *args: self._forward(*args), check, self._made_replayer)
        self.op = _register(name, body, _checked(fake, check), triton)
        self.backward_op = None
        if backward is not None:
            self._plan_backward(backward, name)
            body = _checked(backward, backward_check)
            if replay:
                body = _replaying(backward, lambda *args: self._backward(*args), backward_check,
                                  self._made_backward_replayer)  # fmt: skip
            self.backward_op = _register(f"{name}_backward", body, _checked(backward_fake, backward_check), triton)
            self.op.register_autograd(self._op_backward, setup_context=self._op_setup_context)
            self._function = self._make_function()
        self._visible = lambda out: out[0] if n_out == 1 else out[:n_out]  # forward's outputs without its extras

    # -- the call

    def __call__(self, *args: object, **kwargs: object) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """forward's outputs for forward's parameters (options also by keyword, or left at their defaults),
        differentiable if a backward exists."""
        key, given = None, (args, kwargs)
        if not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0:
            if self._fast is None and self._replay and self.direct and self._replayer is None:
                self._start_replay()  # before the first call, so that it is keyed as the later ones will be
            if self._fast is not None:
                out = self._fast(args, kwargs)  # the whole call in C, or None (or a replay's key): the path below
                if out is not None:
                    if type(out) is not bytes:
                        return out if self._single else self._visible(out)
                    key = out
        if kwargs or len(args) != len(self._params):
            args = self._complete(args, kwargs)
        if self._coerce:
            args = list(args)
            for i, convert in self._coerce:
                args[i] = convert(args[i])
        if self._check is not None:
            self._check(*args)
        if self.direct and not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0:
            if len(self._tensor_idx) == 1:  # written out for one tensor: a model's elementwise ops, called often
                t = args[self._tensor_idx[0]]
                plain, grad = type(t) is torch.Tensor, t.requires_grad
            else:
                tensors = [args[i] for i in self._tensor_idx]
                plain = all(type(t) is torch.Tensor for t in tensors)
                grad = any(t.requires_grad for t in tensors)
            if plain:
                if self._make_fast is not None:  # once: the impl's C entry exists once its forward has run
                    self._fast, self._make_fast = self._make_fast(), None
                if grad and self.backward_op is not None and torch.is_grad_enabled():
                    if key is not None:  # the C entry takes this call, autograd and all, once its forward is recorded
                        self._replayed(args, key)
                        out = self._fast(*given)
                        if type(out) is torch.Tensor:
                            return out
                    return self._function.apply(*args) if self._autograd is None else self._autograd(*args)
                out = self._replayed(args, key) if self._replay else self._forward(*args)
                return out if self._single else self._visible(out)
        out = self.op(*args)
        return out if self._single else self._visible(out)

    def _replayed(self, args: Sequence[object], key: bytes | None = None) -> torch.Tensor:
        """forward(*args) replayed from C where a recipe of the call's key is held; else run, and recorded into a
        recipe (the first call of a key) or, when none can redo it, the key refused for good. key: the call's key as
        the C entry made it (from the arguments as given), when it found no recipe."""
        replayer = self._replayer or self._start_replay()
        if replayer is None:
            return self._forward(*args)
        return _replay(replayer, self._forward, args, key)

    def _start_replay(self) -> object | None:
        """The forward's Replayer, made, and its C entry (`call`) for the eager calls of a direct op; None where
        nothing launches from C (replay is then off)."""
        replayer = self._replayer = self._new_replayer(autograd=True)
        if replayer is not None and self.direct:
            self._fast = replayer.call
        return replayer

    def _made_replayer(self) -> object | None:
        """The forward's Replayer, made on first use; None where replay is off."""
        return self._replayer or (self._start_replay() if self._replay else None)

    def _made_backward_replayer(self) -> object | None:
        """The backward's Replayer (one of its own), made on first use; None where replay is off."""
        if self._backward_replayer is None and self._replay:
            self._backward_replayer = self._new_replayer()
        return self._backward_replayer

    def _replayed_backward(self, args: Sequence[object]) -> tuple[torch.Tensor, ...] | torch.Tensor:
        """backward(*args), as `_replayed` runs forward (a Replayer of its own)."""
        replayer = self._made_backward_replayer()
        if replayer is None:
            return self._backward(*args)
        return _replay(replayer, self._backward, args, None)

    def _new_replayer(self, autograd: bool = False) -> object | None:
        """A replayer: the C++ extension's Replays (with its C++ autograd for forward's, `autograd`), else the C
        module's Replayer; None where nothing launches from C (the interpreter, no C module): replay is then off."""
        replayer = None
        if not _interpreted():
            one = len(self._tensor_idx) == 1 and self.backward_op is not None and autograd
            backward = self._c_backward if one else None
            tensor = self._tensor_idx[0] if one else -1
            plan = (self._saved_from, self._bw_sources) if one else ((), ())
            replayer = launcher.new_replays(tensor, *plan, backward) or launcher.new_replayer()
        if replayer is None:
            self._replay = False
        return replayer

    def _c_backward(
        self, key: bytes | None, options: tuple, grad: torch.Tensor, saved: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The backward of a call the C++ autograd took (`launcher.new_replays`), where it holds no recipe for the
        backward's `key`: run and recorded for it (`add_backward`); with key None (a refused key, replays off, another
        CUDA context), or under CUDA graph capture, run alone. options: forward's options of the call, as its recipe
        kept them."""
        sources = ((grad,), saved, options)
        args = [sources[k][i] for k, i in self._bw_sources]
        if key is None or not launcher.enabled_now() or launcher.recording_now() or launcher.capturing():
            return self._input_grads(self._backward(*args))[self._tensor_idx[0]]
        with launcher.recording() as noted:
            result = self._input_grads(self._backward(*args))[self._tensor_idx[0]]
        self._replayer.add_backward(key, launcher.recipe(args, result, noted))
        return result

    def _complete(self, args: tuple, kwargs: dict) -> tuple:
        """forward's arguments in order, from `args` and options given by keyword or left at their defaults (a
        TypeError, as a call would raise, naming a missing or unknown argument)."""
        n, n_params = len(args), len(self._params)
        if n <= n_params:
            full = [*args, *self._defaults[n:]]
            for name, value in kwargs.items():
                i = self._index.get(name, -1)
                if i < n:  # unknown, or given twice: bind says which
                    break
                full[i] = value
            else:
                if not any(v is _MISSING for v in full):
                    return tuple(full)
        bound = self.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args

    def __repr__(self) -> str:
        return f"FusedOp({NAMESPACE}::{self.name}, kind={self.kind!r}, direct={self.direct})"

    # -- autograd, shared by the op's registration and the eager Function

    def _plan_backward(self, backward: Callable, name: str) -> None:
        """How backward's parameters are filled: ('grad', i), ('saved', name) or ('option', i)."""
        forward_names = list(self._params)
        options = {forward_names[i]: i for i in self._option_idx}
        values = set(forward_names) | set(self.outputs) | set(self.extras)
        plan: list[tuple[str, object]] = []
        saved: list[str] = []
        for p in _signature(backward, f"{name}_backward").parameters:
            if p.startswith("d") and p[1:] in self.outputs:
                plan.append(("grad", self.outputs.index(p[1:])))
            elif p in options:
                plan.append(("option", options[p]))
            elif p in values:
                plan.append(("saved", len(saved)))
                saved.append(p)
            else:
                raise ValueError(
                    f"define_op {name}: backward parameter {p!r} is neither d<output> (outputs: {self.outputs}), "
                    f"nor a forward parameter, output or extra"
                )
        self._bw_plan = tuple(plan)
        self._saved = tuple(saved)
        # where each saved value comes from: (True, i) forward's i-th argument, (False, i) its i-th result
        results = self.outputs + self.extras
        self._saved_from = tuple(
            (True, forward_names.index(n)) if n in forward_names else (False, results.index(n)) for n in saved
        )
        # backward's arguments as (source, i): 0 the gradients, 1 the saved tensors, 2 forward's options
        kinds = {"grad": 0, "saved": 1}
        self._bw_sources = tuple(
            (2, self._option_idx.index(i)) if kind == "option" else (kinds[kind], i) for kind, i in plan
        )

    def _save(self, ctx: object, args: Sequence[object], outs: tuple) -> None:
        ctx.save_for_backward(*[args[i] if arg else outs[i] for arg, i in self._saved_from])
        ctx.forward_options = tuple(args[i] for i in self._option_idx)

    def _backward_args(self, ctx: object, grads: Sequence[torch.Tensor]) -> list[object]:
        sources = (grads, ctx.saved_tensors, ctx.forward_options)
        return [sources[k][i] for k, i in self._bw_sources]

    def _input_grads(self, result: object) -> tuple[torch.Tensor | None, ...]:
        grads = result if isinstance(result, tuple) else (result,)
        if len(grads) != len(self._tensor_idx):
            n = len(self._tensor_idx)
            raise RuntimeError(f"{self.name} backward returned {len(grads)} gradients for {n} tensor inputs")
        out: list[torch.Tensor | None] = [None] * len(self._params)
        for i, g in zip(self._tensor_idx, grads, strict=True):
            out[i] = g
        return tuple(out)

    def _op_setup_context(self, ctx: object, inputs: tuple, output: object) -> None:
        outs = output if isinstance(output, tuple) else (output,)
        self._save(ctx, inputs, outs)
        if self.extras:
            ctx.mark_non_differentiable(*outs[len(self.outputs) :])

    def _op_backward(self, ctx: object, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return self._input_grads(self.backward_op(*self._backward_args(ctx, grads[: len(self.outputs)])))

    def _make_function(self) -> type[torch.autograd.Function]:
        """The eager autograd.Function: forward and backward called directly (grad_fn: <Name>Backward)."""
        fused = self
        n_out = len(self.outputs)

        def forward(ctx: object, *args: object) -> object:
            out = fused._replayed(args) if fused._replay else fused._forward(*args)
            outs = out if isinstance(out, tuple) else (out,)
            fused._save(ctx, args, outs)
            return outs[0] if n_out == 1 else outs[:n_out]

        def backward(ctx: object, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            args = fused._backward_args(ctx, grads)
            return fused._input_grads(fused._replayed_backward(args) if fused._replay else fused._backward(*args))

        title = "".join(part.title() for part in self.name.split("_"))
        body = {"forward": staticmethod(forward), "backward": staticmethod(backward), "__module__": __name__}
        return type(title, (torch.autograd.Function,), body)


def define_op(
    name: str,
    forward: Callable[..., object],
    *,
    fake: Callable[..., object],
    backward: Callable[..., object] | None = None,
    backward_fake: Callable[..., object] | None = None,
    outputs: Sequence[str] = ("y",),
    extras: Sequence[str] = (),
    check: Callable[..., None] | None = None,
    backward_check: Callable[..., None] | None = None,
    kind: Kind = "python",
    direct: bool = True,
    defaults: Mapping[str, object] | None = None,
    autograd: Callable[..., object] | None = None,
    replay: bool = False,
    fast: Callable[[], Callable[[tuple, dict], object] | None] | None = None,
) -> FusedOp:
    """Register ``fuselab::<name>`` (and ``fuselab::<name>_backward``) and return the callable (:class:`FusedOp`).

    forward(*tensors and options) -> outputs then extras (one Tensor or a tuple); annotated, as the schema is
    inferred from it. Its outputs must not alias its inputs (a custom op's rule). Kind "triton": launches its kernels
    through this module's `wrap_triton` and allocates with torch ops only (torch.compile traces it with fake tensors:
    no data_ptr, no host syncs). Kind "cuda": calls the extension; the extension registers its CUDA kernels under
    the same names from C++ when loaded.
    fake: forward's fake impl (same parameters; empty outputs of the right shape, dtype, device and strides).
    backward / backward_fake: the backward (parameters matched by name, see the module docstring) and its fake.
    outputs / extras: names of forward's returns: `outputs` go to the caller and have gradients, `extras` are kept
    for backward only (e.g. attention's logsumexp).
    check(*args): raises a clear error for bad input; run on every call and while tracing (in the fakes).
    backward_check(*backward args): the same for the backward op when called as an op (autograd's own calls, whose
    gradients match by construction, skip it in eager mode).
    direct: let the eager call skip the dispatcher (see :class:`FusedOp`).
    defaults: forward's options that callers may leave out, with their values (trailing parameters).
    autograd: forward's outputs for forward's arguments with their backward already attached, in C++ (a
    torch::autograd::Function of the extension's): the eager path calls it when gradients are needed, instead of a
    Python autograd.Function, so backward runs without Python. Needs `backward` (what compiled code differentiates).
    replay: kinds "triton" and "python" whose kernels launch through `wrap_triton`, at most 4 outputs and extras; a
    promise that forward and backward each return fresh dense tensors (torch.empty, empty_like, empty_permuted) written
    by Triton kernels only, with any scratch from `fuselab.ops.launcher.workspace`: eager calls (forward, and backward
    under autograd, and the registered ops' calls, as a compiled graph makes them) are then replayed from C after the
    first of each key
    (`fuselab.ops.launcher.recipe`; a call it cannot replay runs as before). A user's call is first handed to the
    Replayer's C entry (`call`), which replays a known key without any Python of this module: neither the argument
    completion nor `check`, which must therefore depend on nothing but what the key holds (each tensor's dtype,
    device, shape, strides and alignment; the options' values), as it passed for the first call of that key.
    fast: kind "cuda", a function returning the extension's C++ entry ``entry(args: tuple, kwargs: dict)``: the output
    of a user's call (with autograd's graph where its inputs need one), or None where it leaves the call to the Python
    path (any input it does not take exactly as `check` would accept it, so that errors stay `check`'s). Made by the
    first eager call, which builds the extension.
    """
    return FusedOp(
        name,
        forward,
        fake=fake,
        backward=backward,
        backward_fake=backward_fake,
        outputs=outputs,
        extras=extras,
        check=check,
        backward_check=backward_check,
        kind=kind,
        direct=direct,
        defaults=defaults,
        autograd=autograd,
        replay=replay,
        fast=fast,
    )


@dataclass(frozen=True)
class OpFamily:
    """What an op's fused impls (its Triton and CUDA kernels, say) share: the fakes, and a maker of input checks
    checks(impl name, devices) -> (check, backward_check). `define` registers one impl's op with them."""

    fake: Callable[..., object]
    backward_fake: Callable[..., object]
    checks: Callable[[str, Sequence[str]], tuple[Callable[..., None], Callable[..., None]]]

    def define(
        self, name: str, forward: Callable[..., object], backward: Callable[..., object], devices: Sequence[str],
        kind: Kind, defaults: Mapping[str, object] | None = None, autograd: Callable[..., object] | None = None,
        replay: bool = False, fast: Callable[[], Callable[[tuple, dict], object] | None] | None = None,
    ) -> FusedOp:  # fmt: skip
        """`define_op(name, ...)` with the family's fakes and checks (messages name it "gelu cuda" for "gelu_cuda")."""
        check, backward_check = self.checks(name.replace("_", " "), tuple(devices))
        return define_op(
            name,
            forward,
            backward=backward,
            fake=self.fake,
            backward_fake=self.backward_fake,
            check=check,
            backward_check=backward_check,
            kind=kind,
            defaults=defaults,
            autograd=autograd,
            replay=replay,
            fast=fast,
        )


# ---------------------------------------------------------------------------------------------- pieces


def _replay(replayer: object, fn: Callable[..., object], args: Sequence[object], key: bytes | None) -> object:
    """fn(*args) replayed by `replayer` (a C Replayer) where it holds a recipe of the call's key; else run, recorded
    and the recipe added, or the key refused when no recipe can redo the call (under CUDA graph capture run alone, not
    recorded). key: the key, when the caller already asked the replayer and it held nothing for it."""
    if key is None:
        if not launcher.enabled_now() or launcher.recording_now():
            return fn(*args)
        out = replayer.replay(*args)
        if out is None:  # no key, a refused key, another CUDA context, workspaces of another stream or captured
            return fn(*args)
        if type(out) is not bytes:
            return out
        key = out
    if launcher.capturing():  # a recipe recorded now would hold the graph's own buffers: the key, refused for good
        return fn(*args)
    with launcher.recording() as noted:
        result = fn(*args)
    recipe = launcher.recipe(args, result, noted)
    if recipe is None:
        replayer.refuse(key)
    else:
        replayer.add(key, recipe)
    return result


def _replaying(
    fn: Callable, run: Callable[..., object], check: Callable[..., None] | None, replayer: Callable[[], object | None]
) -> Callable:
    """The body of a replay op as registered (what a compiled graph calls): run(*args) after check(*args), with fn's
    signature (the schema's), replayed from C first where `replayer()` holds a recipe of the call's key; `check` is then
    skipped, as the eager C entry skips it (it passed for the key's first call and depends on nothing but the key).
    Tensor subclasses, recordings and replays switched off run `run` as before."""

    @functools.wraps(fn)
    def body(*args: object) -> object:
        key = held = None
        if _replayable(args) and (held := replayer()) is not None:
            out = held.replay(*args)
            if out is not None and type(out) is not bytes:
                return out
            # a key without a recipe: recorded below; None: a refused key, or a recipe not runnable now (another
            # stream, a capture), run alone
            key = out
        if check is not None:
            check(*args)
        return run(*args) if key is None else _replay(held, run, args, key)

    return body


def _replayable(args: Sequence[object]) -> bool:
    """Whether a registered op's call on `args` may be replayed now: replays on, no recording or tracing, no tensor
    subclass. (Under CUDA graph capture the C module replays no recipe that holds workspaces.)"""
    if not launcher.enabled_now() or launcher.recording_now() or launcher.tracing():
        return False
    return not any(isinstance(a, torch.Tensor) and type(a) is not torch.Tensor for a in args)


def _with_defaults(signature: inspect.Signature, defaults: dict[str, object], name: str) -> inspect.Signature:
    """forward's `signature` with `defaults` set (they must name its trailing parameters), no return annotation."""
    unknown = set(defaults) - set(signature.parameters)
    if unknown:
        raise ValueError(f"define_op {name}: defaults for {sorted(unknown)}, which forward does not take")
    params = [p.replace(default=defaults[p.name]) if p.name in defaults else p for p in signature.parameters.values()]
    try:
        return inspect.Signature(params)
    except ValueError:
        raise ValueError(f"define_op {name}: defaults must be for forward's trailing parameters") from None


def _coercer(annotation: object) -> Callable[[object], object] | None:
    """How an option annotated `annotation` is converted for the schema: bool, int, float (None kept for
    float | None); None for the others (str, tensors)."""
    if annotation in (bool, int, float):
        return annotation
    if annotation == (float | None):
        return lambda value: None if value is None else float(value)
    return None


def _signature(fn: Callable, name: str) -> inspect.Signature:
    """fn's signature, annotations evaluated; ValueError unless every parameter is positional and annotated."""
    try:
        signature = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError) as exc:
        raise ValueError(f"define_op {name}: cannot read the annotations of {fn.__qualname__}: {exc}") from None
    for p in signature.parameters.values():
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise ValueError(f"define_op {name}: parameter {p.name!r} of {fn.__qualname__} must be positional")
        if p.annotation is inspect.Parameter.empty:
            raise ValueError(f"define_op {name}: parameter {p.name!r} of {fn.__qualname__} needs a type annotation")
    return signature


def _checked(fn: Callable, check: Callable[..., None] | None) -> Callable:
    """fn, calling check(*args) first; with fn's signature (schemas are inferred from it)."""
    if check is None:
        return fn

    @functools.wraps(fn)
    def checked(*args: object) -> object:
        check(*args)
        return fn(*args)

    return checked


def _register(name: str, fn: Callable, fake: Callable, triton: bool) -> torch.library.CustomOpDef:
    """fuselab::<name> on fn: a triton_op (traced by torch.compile) or a custom_op (opaque) with `fake`."""
    qualname = f"{NAMESPACE}::{name}"
    if triton and _triton_traceable():
        op = torch.library.triton_op(qualname, fn, mutates_args=())  # its fake: fn itself, traced
    else:
        op = torch.library.custom_op(qualname, fn, mutates_args=())
        op.register_fake(fake)
    return op
