"""The report's inspect section is a table, one row per compiled kernel, not raw text."""

from fuselab.profile.asm import GlobalAccess, KernelAsm, Resources
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections.inspection import HEADERS, inspect_section, kernel_row


def test_a_kernel_row_gives_registers_spills_shared_memory_and_the_widest_accesses():
    kernel = KernelAsm(
        name="_softmax_rows_kernel",
        impl="triton",
        arch="sm_90",
        origin="test",
        resources=Resources(registers=40, shared_bytes=1536, spill_stores=0, spill_loads=0),
        num_warps=8,
        loads=[GlobalAccess("ld.global.v4.b32", 4, 16), GlobalAccess("ld.global.b32", 1, 4)],
        stores=[GlobalAccess("st.global.b32", 2, 4)],
    )
    row = kernel_row("softmax", "triton", kernel)
    assert len(row) == len(HEADERS)
    assert row == ["softmax / triton", "_softmax_rows_kernel", "8", "40", "none", "1.5 KiB",
                   "`ld.global.v4.b32` (16 B)", "`st.global.b32` (4 B)"]  # fmt: skip
    spilling = KernelAsm(
        name="void gelu_kernel<float>(float const*, float*, long)",
        impl="cuda",
        arch="sm_90",
        origin="test",
        resources=Resources(registers=255, spill_stores=24, spill_loads=16),
    )
    row = kernel_row("gelu", "cuda", spilling)
    assert row[1] == "gelu_kernel<float>" and row[2] == "" and row[4] == "**24 B / 16 B**"
    assert row[5] == "" and row[6] == "none" and row[7] == "none"


def test_kernel_names_lose_return_type_anonymous_namespaces_and_arguments():
    from fuselab.report.sections.inspection import short_kernel_name

    name = "void fuselab::gelu::(anonymous namespace)::gelu_kernel<float, (fuselab::gelu::Form)1>(float const*, long)"
    assert short_kernel_name(name) == "gelu_kernel<float, (Form)1>"
    assert short_kernel_name("attention_fwd_kernel") == "attention_fwd_kernel"
    assert short_kernel_name("k<" + "x" * 80 + ">()", width=20) == "k<" + "x" * 17 + "…"


def test_the_section_draws_one_table_row_per_kernel(tmp_path):
    from fuselab.report.budgets import QUICK

    ctx = Context(out=tmp_path, device="cpu", mode="quick", budget=QUICK)
    doc = Doc(tmp_path)
    result = inspect_section(ctx, doc)
    kernels = [k for item in result["items"] if "error" not in item for k in item["kernels"]]
    tables = [b for b in doc.blocks if b["kind"] == "table"]
    assert kernels and len(tables) == 1 and tables[0]["headers"] == HEADERS
    assert len(tables[0]["rows"]) == len(kernels)
    assert not [b for b in doc.blocks if b["kind"] == "code"]  # no raw text of the kernels
    assert all(row[3].isdigit() for row in tables[0]["rows"])  # registers, from ptxas
