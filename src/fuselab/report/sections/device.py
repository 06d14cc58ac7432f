"""The device section: the measured ceilings every other figure is set against."""

from __future__ import annotations

from fuselab.bench.ceilings import busy_note, get_ceilings
from fuselab.report.doc import Doc
from fuselab.report.runner import Context
from fuselab.studies import roofline


def device_section(ctx: Context, doc: Doc) -> dict:
    c = get_ceilings(ctx.device, refresh=ctx.budget["ceilings_refresh"])
    doc.text(
        "Every GB/s and TFLOP/s below is set against these ceilings, measured on this device (not the datasheet): "
        "a device-to-device copy (bytes read + written), large square matmuls per dtype, and the cost of "
        "launching a tiny kernel."
    )
    rows = [["copy bandwidth", f"{c['copy_gbps']:.0f} GB/s"]]
    rows += [[f"matmul {k} ({c['matmul_n']}³)", f"{v:.3g} TFLOP/s"] for k, v in c["matmul_tflops"].items()]
    rows += [["launch (host)", f"{c['launch_us']:.2f} µs"], ["tiny kernel (device)", f"{c['tiny_kernel_us']:.2f} µs"]]
    env = c["env"]
    for key in ("gpu", "cpu", "sm_count", "l2_bytes", "memory_bytes", "driver", "torch", "triton", "cuda"):
        if env.get(key) is not None:
            rows.append([key, str(env[key])])
    doc.table(["ceiling", "measured"], rows)
    if busy_note(c):
        doc.text(f"**Note:** {busy_note(c)}.")
    ridge = {k: roofline.ridge_point(c["copy_gbps"], v) for k, v in c["matmul_tflops"].items()}
    doc.text(
        "Ridge points (FLOP per byte where compute, not memory, becomes the limit): "
        + ", ".join(f"{k} {v:.3g}" for k, v in ridge.items())
        + ". A kernel doing fewer FLOPs per byte moved than this is memory-bound on this device."
    )
    keys = ("copy_gbps", "matmul_tflops", "matmul_n", "launch_us", "tiny_kernel_us", "cpu_busy", "env", "quick")
    return {**{k: c.get(k) for k in keys}, "ridge_ai": ridge}
