"""The one dtype codec (fuselab.bench.dtypes): every form of a dtype to every other, and a clear error otherwise."""

import pytest
import torch

from fuselab.bench.dtypes import DTYPES, dtype_name, parse_dtype, short_name


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
def test_every_form_round_trips(dtype: torch.dtype) -> None:
    name, short = dtype_name(dtype), short_name(dtype)
    assert parse_dtype(name) is dtype and parse_dtype(short) is dtype and parse_dtype(dtype) is dtype
    assert parse_dtype(f"torch.{name}".upper()) is dtype
    assert dtype_name(short) == name and short_name(name) == short and short_name(short) == short


def test_the_names_tables_and_logs_use() -> None:
    assert [short_name(d) for d in (torch.float32, torch.float16, torch.bfloat16)] == ["fp32", "fp16", "bf16"]
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert short_name(None) == "" and short_name("int8") == "int8"  # tables show what they are given


def test_an_unknown_name_says_what_is_accepted() -> None:
    with pytest.raises(ValueError, match=r"unknown dtype 'fp8'.*accepted: float32, .*bf16"):
        parse_dtype("fp8")
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype(torch.int8)
