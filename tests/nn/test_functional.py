"""fuselab.nn.functional.scaled_dot_product_attention takes torch's signature (issue 24): query, key, value,
attn_mask=None, dropout_p=0.0, is_causal=False, then keyword-only scale=None, enable_gqa=False, as
torch.nn.functional.scaled_dot_product_attention; what it cannot do is a clear error naming the alternative."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

import fuselab.nn


def sdpa():
    return fuselab.nn.functional.scaled_dot_product_attention


def qkv(shape=(2, 4, 9, 16)):
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=gen) for _ in range(3)]


def test_the_parameters_are_torchs_in_its_order_with_its_defaults() -> None:
    params = inspect.signature(sdpa()).parameters
    torchs = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    assert list(params)[: len(torchs)] == torchs
    defaults = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False}
    assert {k: params[k].default for k in defaults} == defaults
    keyword_only = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only[:2] == ["scale", "enable_gqa"]  # as torch's: a seventh positional argument is an error
    q, k, v = qkv()
    for fn in (F.scaled_dot_product_attention, sdpa()):
        with pytest.raises(TypeError):
            fn(q, k, v, None, 0.0, False, 0.5)


def test_calls_written_for_torch_give_torchs_result() -> None:
    q, k, v = qkv()
    for args, kwargs in [((), {}), ((None, 0.0, True), {}), ((), {"is_causal": True, "scale": 0.3})]:
        want = F.scaled_dot_product_attention(q, k, v, *args, **kwargs)
        torch.testing.assert_close(sdpa()(q, k, v, *args, **kwargs, impl="naive"), want)
    kv = [t[:, :2] for t in (k, v)]
    want = F.scaled_dot_product_attention(q, *kv, enable_gqa=True)
    torch.testing.assert_close(sdpa()(q, *kv, enable_gqa=True, impl="naive"), want)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda f, q, k, v: f(q, k, v, torch.ones(9, 9, dtype=torch.bool)), "no attn_mask"),  # a positional mask
        (lambda f, q, k, v: f(q, k, v, attn_mask=torch.zeros(9, 9)), "no attn_mask"),
        (lambda f, q, k, v: f(q, k, v, None, 0.1), "no dropout"),
        (lambda f, q, k, v: f(q, k[:, :2], v[:, :2]), "enable_gqa=True"),
    ],
)
def test_what_it_cannot_do_is_a_clear_error_naming_the_alternative(call, message) -> None:
    q, k, v = qkv()
    with pytest.raises(ValueError, match=message) as refused:
        call(sdpa(), q, k, v)
    text = str(refused.value)
    assert "ambiguous" not in text
    assert "torch.nn.functional.scaled_dot_product_attention" in text or "enable_gqa=True" in text


def test_the_default_impl_is_auto_and_on_the_cpu_not_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """impl="auto" by default, as the nn modules: on CPU tensors it resolves to the op's native impl there (one with
    no Triton kernels, which would run under the interpreter), and gives torch's result."""
    from fuselab.ops.attention import ATTENTION, functional

    assert inspect.signature(sdpa()).parameters["impl"].default == "auto"
    resolved = []
    real = functional.attention

    def recording(*args: torch.Tensor, impl: str, **kwargs: object) -> torch.Tensor:
        resolved.append(impl)
        return real(*args, impl=impl, **kwargs)

    monkeypatch.setattr(functional, "attention", recording)
    q, k, v = qkv()
    torch.testing.assert_close(sdpa()(q, k, v, is_causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert resolved == [ATTENTION.native_impl("cpu")]
    assert ATTENTION.get_impl(resolved[0]).triton_kernels is None, resolved
