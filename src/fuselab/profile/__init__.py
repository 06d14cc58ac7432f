"""Profiling: torch.profiler runs, kernel tables, NVTX ranges, timeline pictures, run-ahead study, asm inspection.

import fuselab.profile as fp
with fp.range("forward"):              # NVTX + record_function: shows in nsys and in our traces
    ...
result = fp.profile_callable(fn, label="fn", out_dir="prof")
print(fp.build_table(result.trace).sorted("gpu").to_text())
fp.render_timeline(result.trace, "prof/timeline.png")
"""

from fuselab.profile.capture import ProfileResult, impl_callable, profile_callable, script_callable
from fuselab.profile.ranges import range
from fuselab.profile.table import KernelTable, build_table, short_kernel_name
from fuselab.profile.timeline import render_timeline
from fuselab.profile.trace import Trace

__all__ = [
    "KernelTable",
    "ProfileResult",
    "Trace",
    "build_table",
    "impl_callable",
    "profile_callable",
    "range",
    "render_timeline",
    "script_callable",
    "short_kernel_name",
]
