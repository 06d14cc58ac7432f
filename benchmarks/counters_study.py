"""Hardware counters of every registered op's impls at one large and one small shape, in one ncu run.

    python benchmarks/counters_study.py --out benchmarks/results/h200/counters.json [--with-compile]

Shapes are chosen by rule, for any op: large = the op's middle bench shape, small = its leading dimension divided
by 256, plus one (an odd size nobody tuned for). torch.compile impls are left out unless --with-compile (each
compiles under ncu, which is slow). Writes the JSON (per case: DRAM bytes against the minimum, verdicts) and the
ncu report beside it in --work.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from fuselab.bench.env import environment
from fuselab.ops.registry import all_ops
from fuselab.profile.counters import Case, find_ncu, ncu_version, plot_rooflines, run_cases, study_shapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--work", type=Path, default=Path("counters-work"), help="folder for the ncu report")
    parser.add_argument("--with-compile", action="store_true", help="also the torch.compile impls")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--ceilings", type=Path, help="a device.json (copy_gbps, matmul_tflops): also draw rooflines")
    args = parser.parse_args()
    cases = []
    for op in all_ops():
        for shape in study_shapes(op):
            for name, impl in op.impls.items():
                if impl.compiled and not args.with_compile:
                    continue
                cases.append(Case(op.name, name, shape, args.dtype))
    start = time.perf_counter()
    result = run_cases(cases, out_dir=args.work)
    record = {
        "what": "fuselab counters study: ncu hardware counters per impl against the op's cost model",
        "env": environment("cuda"),
        "ncu": ncu_version(find_ncu()),
        "elapsed_s": time.perf_counter() - start,
        **result.to_json(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(result.text())
    if args.ceilings:
        device = json.loads(args.ceilings.read_text())
        device = device.get("results", device)  # a report section's record or the ceilings themselves
        paths = plot_rooflines(result.rows, device["copy_gbps"], device["matmul_tflops"], args.out.parent, "counters")
        print("wrote", ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
