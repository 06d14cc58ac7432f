"""`--help` names the ops from the registry (issue 24: it read "(gelu, softmax)" beside three ops): an op registered
now shows up in the help of every command that takes one; tune's names the ops that have a tuner."""

from __future__ import annotations

import math

import pytest
import torch

from fuselab.cli import main
from fuselab.ops.registry import Defaults, Op, all_ops, register_op, unregister_op


@pytest.fixture
def extra_op():
    op = Op(
        name="helptoy",
        reference=lambda x: x,
        make_inputs=lambda shape, dtype, device, seed: (torch.ones(shape, dtype=dtype, device=device),),
        bytes_moved=lambda shape, dtype: 2 * math.prod(shape) * dtype.itemsize,
        flops=lambda shape: 0,
        tolerance={torch.float32: 1e-6},
        defaults=Defaults(check_shapes=[(3,)]),
    )
    register_op(op)
    yield op
    unregister_op(op.name)


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["check", "bench", "profile", "inspect"])
def test_the_op_argument_names_every_registered_op(command, extra_op, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside the list
    names = ", ".join(op.name for op in all_ops())
    assert "helptoy" in names
    assert names in help_text(command, capsys)


def test_tune_names_the_ops_with_a_tuner(extra_op, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    tuned = [op.name for op in all_ops() if op.tuner]
    assert tuned and "helptoy" not in tuned
    assert ", ".join(tuned) in help_text("tune", capsys)
