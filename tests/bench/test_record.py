"""The typed records: a Case and a Row, their one JSON form, and logs written before them."""

import dataclasses
import json

import pytest
import torch

from fuselab.bench.log import case_key
from fuselab.bench.record import Case, Row, Status, as_json, value


def test_a_case_is_built_once_in_canonical_form_and_keys_as_the_logs_always_did():
    case = Case.of("gelu", "triton", torch.bfloat16, [3, 11008], {"approximate": "tanh"})
    assert case == Case.of("gelu", "triton", "bf16", (3, 11008), {"approximate": "tanh"})  # one dtype codec
    assert case.dtype == "bfloat16" and case.shape == (3, 11008) and case.torch_dtype is torch.bfloat16
    fields = {"op": "gelu", "impl": "triton", "dtype": "bfloat16", "shape": [3, 11008], "approximate": "tanh"}
    assert case.to_json() == {**fields, "pass": "forward"}
    assert case.key == case_key({**fields, "pass": "forward"}) == case_key(case)
    laid = dataclasses.replace(case, layout="sliced", pass_=None)  # a check: no pass; a layout other than contiguous
    assert laid.to_json() == {**fields, "layout": "sliced"}
    assert case.peer_key == case.with_impl("torch").peer_key != laid.peer_key
    with pytest.raises(ValueError, match="unknown pass"):
        Case.of("gelu", "triton", "fp32", (7,), pass_="backward")
    with pytest.raises(ValueError):
        Case.of("gelu", "triton", "float33", (7,))


def test_a_row_round_trips_through_its_json_form_and_old_log_lines_load():
    case = Case.of("softmax", "triton", "fp32", (5, 50257))
    row = Row(case, median_ms=0.25, gbps=8.0, speedup=1.5, baseline="torch", warnings=("noisy",), host="h")
    line = json.loads(json.dumps(row.to_json()))
    assert line["speedup_vs_torch"] == 1.5 and line["warnings"] == ["noisy"] and line["error"] is None
    assert "tflops" not in line and line["key"] == case.key  # only what the row holds
    assert Row.from_json(line) == row
    old = {  # a line of a log written before the records (2026-11-30): a field no Row holds is kept
        "op": "softmax", "impl": "torch", "dtype": "float32", "shape": [5, 50257], "pass": "forward",
        "status": "ok", "median_ms": 0.3, "warnings": [], "key": case.with_impl("torch").key, "l2_note": "x",
    }  # fmt: skip
    loaded = Row.from_json(old, options=())
    assert loaded.case == case.with_impl("torch") and loaded.status is Status.OK and loaded.median_ms == 0.3
    assert loaded.extra == {"l2_note": "x"} and loaded.to_json()["l2_note"] == "x"
    keyed = Case.of("gelu", "torch", "fp32", (5,), {"approximate": "none"})
    with_option = Row.from_json({**old, **keyed.to_json(), "key": keyed.key})  # options=None: the key's fields
    assert with_option.case == keyed and with_option.extra == {"l2_note": "x"}
    unkeyed = {k: v for k, v in with_option.to_json().items() if k not in ("key", "l2_note")}
    assert Row.from_json(unkeyed).case == keyed  # no key: a key that is not a field is an option
    assert value(row, "shape") == [5, 50257] and value(row, "speedup_vs_torch") == 1.5 and value(row, "nope") is None
    assert value({"a": 1}, "a") == 1 and as_json({"a": 1}) == {"a": 1} and as_json(row) == row.to_json()


def test_a_row_is_frozen_and_a_derived_value_is_a_new_row():
    row = Row(Case.of("gelu", "torch", "fp32", (9,)), median_ms=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.median_ms = 2.0  # type: ignore[misc]
    faster = row.updated(median_ms=0.5)
    assert faster.median_ms == 0.5 and row.median_ms == 1.0 and faster.case is row.case
    assert row.measured and not Row(row.case, status=Status.SKIPPED, error="not timed").measured


def test_rows_of_the_h200_logs_written_before_the_records_load_and_write_back_the_same():
    """Lines of the H200 report's logs (2026-12-01, revision d84f83f: every op, measured, skipped and unavailable
    rows, forward and backward, compiled impls, back-to-back timings) load as Rows keyed as before, and their JSON
    form is the line again."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / "data" / "h200_log_rows.jsonl").read_text().splitlines()
    assert len(lines) >= 8
    statuses = set()
    for line in lines:
        logged = json.loads(line)
        row = Row.from_json(logged)
        statuses.add(row.status)
        assert row.case.key == logged["key"] and row.case.op == logged["op"]
        back = row.to_json()
        assert {k: v for k, v in back.items() if v not in (None, [])} == {
            k: v for k, v in logged.items() if v not in (None, [])
        }
    assert {Status.OK, Status.SKIPPED} <= statuses
