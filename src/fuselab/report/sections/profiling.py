"""The profiling sections: torch.profiler on the lecture's cases, and the CPU running ahead of the GPU."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from fuselab.bench.shapes import format_shape
from fuselab.ops.registry import Shape, all_ops
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.report.sections._common import first_line


def profile_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile import build_table, impl_callable, profile_callable
    from fuselab.profile.cases import CASES
    from fuselab.profile.table import format_us

    cfg = ctx.budget["profile"]
    names = cfg["cases"] or list(CASES)
    runs: list[tuple[str, str, Callable[[], object]]] = [(n, CASES[n].doc, CASES[n].make(ctx.device)) for n in names]
    for op in all_ops():  # every op's naive impl: the many kernels fusion removes
        impl = cfg["op_impl"]
        if impl not in op.impls or op.get_impl(impl).unavailable(ctx.device):
            continue
        shape = shrink(op.default_profile_shape(), cfg["op_numel"])
        fn = impl_callable(op, impl, shape, torch.float32, ctx.device)
        runs.append((f"{op.name}_{impl}", f"{op.name} {impl}, shape {format_shape(shape)}, float32", fn))
    doc.text(
        "torch.profiler on the lecture's cases: each operator the code called, and below it (└) the GPU kernels it "
        "launched, with their total time over the profiled calls. Traces (open in https://ui.perfetto.dev) are in "
        "`traces/`." + ("" if ctx.on_gpu else " Without a GPU the rows are CPU operators and their CPU time.")
    )
    cases, facts = {}, {"gpu": ctx.on_gpu}
    for name, what, fn in runs:
        try:
            result = profile_callable(
                fn,
                label=name,
                warmup=cfg["warmup"],
                iters=cfg["iters"],
                out_dir=ctx.out / "traces" / name,
                cuda=ctx.on_gpu,
            )
        except Exception as exc:  # one case failing leaves the others
            cases[name] = {"error": f"{type(exc).__name__}: {first_line(exc)}"}
            doc.text(f"### {name}\n\n{what}: **failed**: `{cases[name]['error']}`")
            continue
        table = build_table(result.trace, title=name)
        gzip_traces(result.trace_path.parent)
        kernels = sorted({k.name for o in table.ops for k in o.kernels})
        cpu_ops = sorted({e.name for e in result.trace.ops})
        cases[name] = {
            "doc": what,
            "iters": cfg["iters"],
            "kernels": kernels,
            "distinct_kernels": len(kernels),
            "cpu_ops": cpu_ops,
            "table": table.to_json(),
        }
        rows = []
        for o in table.ops[:12]:
            label = o.name if o.kind == "op" else f"[range] {o.name}"
            rows.append(
                [
                    f"**{label}**",
                    o.calls,
                    format_us(o.gpu_us) if o.kernels else "",
                    format_us(o.cpu_us),
                    f"{100 * table.share(o):.1f}",
                ]
            )
            rows += [
                [f"└ `{k.name}`", k.calls, format_us(k.gpu_us), "", f"{100 * table.share(k):.1f}"]
                for k in o.kernels[:8]
            ]
        doc.text(
            f"### {name}\n\n{what}. "
            + (
                f"{len(kernels)} distinct kernel(s)."
                if ctx.on_gpu
                else f"{len(cpu_ops)} distinct operator(s), nested ones included."
            )
        )
        doc.table(["operator / └ kernel", "calls", "GPU total", "CPU total", "%"], rows)
    if all("error" in c for c in cases.values()):
        raise RuntimeError("every profiling case failed")
    count = "distinct_kernels" if ctx.on_gpu else None

    def n_of(case: str) -> int | None:
        c = cases.get(case, {})
        if "error" in c or not c:
            return None
        return c[count] if count else len(c["cpu_ops"])

    facts.update(
        cdist_kernels=n_of("cdist"),
        gelu_add_kernels=n_of("gelu_add"),
        softmax_add_kernels=n_of("softmax_add"),
        naive_kernels={op.name: n_of(f"{op.name}_{cfg['op_impl']}") for op in all_ops()},
        matmul_kernels={
            k.removeprefix("matmul"): ", ".join(cases[k]["kernels"] or ["(CPU: no kernels)"])
            for k in ("matmul128", "matmul2048")
            if k in cases and "error" not in cases[k]
        },
    )
    return {"cases": cases, "facts": facts}


def shrink(shape: Shape, numel: int | None) -> Shape:
    """`shape` with its largest dimensions halved (the last one only when it is the only one left above 1) until it
    holds at most `numel` elements; None keeps it whole."""
    dims = list(shape)
    while numel is not None and math.prod(dims) > numel:
        lead = [i for i in range(len(dims) - 1) if dims[i] > 1]
        i = max(lead, key=lambda j: dims[j]) if lead else len(dims) - 1
        if dims[i] <= 1:
            break
        dims[i] = max(1, dims[i] // 2)
    return tuple(dims)


def runahead_section(ctx: Context, doc: Doc) -> dict:
    from fuselab.profile.runahead import MLPConfig, run_runahead

    cfg = ctx.budget["runahead"]
    study = run_runahead(
        MLPConfig(steps=cfg["steps"], layers=cfg["layers"], device=ctx.device), ctx.out / "traces" / "runahead"
    )
    doc.text(
        "A training loop of an MLP, run twice: plainly, and printing the loss (`loss.item()`) every step. CUDA calls "
        "are asynchronous, so in the plain loop the CPU queues kernels and runs ahead of the GPU; reading the loss "
        "makes it wait for the GPU every step. In the timelines, grey lines join each launch (CPU) to its kernel "
        "(GPU): the further they lean right, the further ahead the CPU is. Red marks are synchronizations."
    )
    gzip_traces(ctx.out / "traces" / "runahead")
    doc.code(study.summary(), caption="run-ahead summary")
    plain, printed = study.runs[0], study.runs[1]
    for run in study.runs:
        dst = ctx.plot(f"runahead_{run.name}.png")
        dst.write_bytes(run.timeline_path.read_bytes())
        doc.image(dst, f"{run.name}: {run.wall_ms:.1f} ms wall for {study.config.steps} steps")
    facts = {
        "gpu": plain.analysis.has_gpu,
        "lead_ms": plain.analysis.lag_ms_max,
        "steps_ahead_max": plain.analysis.steps_ahead_max,
        "sync_wait_ms": printed.analysis.sync_wait_ms,
        "wall_plain_ms": plain.wall_ms,
        "wall_print_ms": printed.wall_ms,
        "added_syncs": study.added_syncs,
    }
    summary = study.to_json()
    for run in summary["runs"]:  # paths inside the report folder, traces compressed above
        run["trace"] = f"traces/runahead/{Path(run['trace']).name}.gz"
        run["timeline"] = f"plots/runahead_{run['name']}.png"
    return {"study": summary, "facts": facts}


def gzip_traces(folder: Path) -> None:
    """Compress the Chrome traces (trace*.json) in `folder` to .json.gz (Perfetto opens them as they are)."""
    import gzip
    import shutil

    for path in folder.glob("trace*.json"):
        with path.open("rb") as src, gzip.open(path.with_name(path.name + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()
