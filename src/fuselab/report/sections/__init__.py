"""The report's sections, in the lecture's order. Each is `fn(ctx, doc) -> results` (see fuselab.report.runner).

Measuring is done by the library (fuselab.bench, fuselab.evaluate, fuselab.studies, fuselab.profile); a
section picks the sizes of its mode (fuselab.report.budgets, or the op's own plan), runs, writes plots, and says what
it shows. Every registered op gets one section (`op_section`), in the order of `all_ops()`; every_shape and call_cost
each cover every op in one section.
"""

from __future__ import annotations

from fuselab.ops.registry import all_ops
from fuselab.report.runner import Section
from fuselab.report.sections.call_cost import call_cost_section
from fuselab.report.sections.counters import counters_section
from fuselab.report.sections.derived import claims_section, roofline_section
from fuselab.report.sections.device import device_section
from fuselab.report.sections.every_shape import every_shape_section
from fuselab.report.sections.inspection import inspect_section
from fuselab.report.sections.ops import op_section
from fuselab.report.sections.pitfalls import pitfalls_section
from fuselab.report.sections.profiling import profile_section, runahead_section
from fuselab.report.sections.scaling import matmul_section, mlp_section


def sections() -> list[Section]:
    """Every section of the report, one per registered op among them (ops added since are included)."""
    return [
        Section("device", "Device ceilings", device_section),
        Section("pitfalls", "Benchmarking done right and wrong", pitfalls_section),
        Section("matmul", "Scaling: matmul time and TFLOP/s against size", matmul_section),
        Section("mlp", "Scaling: an MLP against layers, steps, batch and dim", mlp_section),
        *[Section(op.name, op.title, op_section(op)) for op in all_ops()],
        Section(
            "every_shape",
            "Every shape: each impl against the best PyTorch peer on random shapes",
            every_shape_section(),
        ),
        Section("call_cost", "The cost of one call: time per call against size", call_cost_section()),
        Section("profile", "Profiling the lecture's cases", profile_section),
        Section("runahead", "The CPU runs ahead: timelines", runahead_section),
        Section("inspect", "Inside the Triton (and CUDA) kernels", inspect_section),
        Section("counters", "Hardware counters: bytes moved against the cost model", counters_section),
        Section("roofline", "Roofline", roofline_section, derived=True),
        Section("claims", "Claims reproduced", claims_section, derived=True),
    ]


def section_names() -> list[str]:
    return [s.name for s in sections()]


__all__ = ["section_names", "sections"]
