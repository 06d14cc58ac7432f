"""Hardware counters: why a kernel is slow, measured with Nsight Compute (`ncu`) and held against the op's cost model.

    result = profile_counters(get_op("gelu"), ["naive", "triton"], shape=(2**26,))
    print(result.text())            # per impl: DRAM bytes against the minimum, then one verdict line per kernel

How it runs: the parent starts `ncu ... python -m fuselab.profile.counters --child SPEC.json`. The child makes each
case's inputs, calls it `warmup` times outside any range, then calls it inside the NVTX range `fuselab-counters`;
ncu profiles only kernels launched in that range (`--nvtx-include fuselab-counters/`), so set-up, compilation and
warm-up launches are never measured. Each case in the range starts with one `torch.cuda._sleep` launch (the
`spin_kernel` marker) so that kernels are assigned to cases by order, whichever way the report is read.
ncu flushes the caches before every profiled kernel (its default `--cache-control all`) and leaves the clocks alone
(`--clock-control none`, as this project's machines require).

Results are read through Nsight Compute's Python module `ncu_report` (in its extras/python) when it imports, else
from its CSV export (`ncu --import REP --csv --page raw --print-units base`); never from the text it prints.
Units everywhere: bytes, nanoseconds, percent.
"""

from fuselab.profile.counters.child import Case
from fuselab.profile.counters.ncu import (
    MARKER,
    RANGE,
    CountersUnavailable,
    counters_unavailable,
    explain_failure,
    find_ncu,
    ncu_command,
    ncu_version,
    parse_raw_csv,
    parse_value,
    read_report,
    run_ncu,
)
from fuselab.profile.counters.roofline import dram_peak_gbps, plot_rooflines, roofline_points
from fuselab.profile.counters.study import (
    CountersResult,
    affordable_shape,
    profile_counters,
    run_cases,
    study_shapes,
)
from fuselab.profile.counters.verdicts import Kernel, assess_case, bytes_line, split_by_marker, verdict

__all__ = [
    "MARKER",
    "RANGE",
    "Case",
    "CountersResult",
    "CountersUnavailable",
    "Kernel",
    "affordable_shape",
    "assess_case",
    "bytes_line",
    "counters_unavailable",
    "dram_peak_gbps",
    "explain_failure",
    "find_ncu",
    "ncu_command",
    "ncu_version",
    "parse_raw_csv",
    "parse_value",
    "plot_rooflines",
    "profile_counters",
    "read_report",
    "roofline_points",
    "run_cases",
    "run_ncu",
    "split_by_marker",
    "study_shapes",
    "verdict",
]
