"""A user's own functions, for the CLI tests (`fuselab bench tests/data/userfn.py:scaled_tanh`)."""

import torch


def scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return 2.0 * torch.tanh(x)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b


def broken(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("this function always fails")
