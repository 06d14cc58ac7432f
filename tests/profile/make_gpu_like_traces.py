"""Write the handmade GPU-like traces in tests/data/profile/ (run: python tests/profile/make_gpu_like_traces.py).

They imitate a torch.profiler trace of `fuselab.profile.runahead.train` on a GPU, in Kineto's format
(cpu_op / user_annotation / cuda_runtime events on a CPU thread, kernel / gpu_memcpy events on device 0
stream 7, linked by args["correlation"], with ac2g flow events), small enough to check by hand:

plain: 3 steps, 100 µs apart; each step launches 3 kernels (cudaLaunchKernel at +10, +40, +70 µs, each inside
an aten::mm) of 150 µs each; a kernel starts 5 µs after its launch or when the previous one ends. So the GPU
falls behind: kernel starts 15, 165, 315 | 465, 615, 765 | 915, 1065, 1215 µs; launch-to-start lags 5, 125,
245, 355, 475, 595, 705, 825, 945 µs (median 475, max 945); the CPU is in step 0, 1, 2 | 2, 2, 2 | 2, 2, 2
when they start: steps ahead 0, 1, 2, 1, 1, 1, 0, 0, 0 (max 2, median 1). Then one cudaDeviceSynchronize.

print: the same, plus `loss.item()` at the end of each step: aten::item > aten::_local_scalar_dense >
cudaMemcpyAsync (a 2 µs DtoH copy after the step's kernels) and cudaStreamSynchronize until it is done. The
CPU never gets ahead (0 steps); syncs: 3 DtoH copies and 3 cudaStreamSynchronize more than plain.
"""

from __future__ import annotations

import json
from pathlib import Path

PID = TID = 4242
DEVICE, STREAM = 0, 7
T0 = 1_000_000.0  # µs, like Kineto's relative timestamps
KERNEL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
)


def make_trace(print_loss: bool, steps: int = 3, launches: int = 3, kernel_us: float = 150.0) -> dict:
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "ts": T0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": DEVICE, "tid": 0, "ts": T0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": DEVICE, "tid": 0, "ts": T0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": DEVICE, "tid": STREAM, "ts": T0, "args": {"name": "stream 7 "}},
    ]
    ids = {"corr": 100, "ext": 1}

    def cpu(cat: str, name: str, ts: float, dur: float, **args: object) -> None:
        args = {"External id": ids["ext"], **args}
        ids["ext"] += 1
        events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": ts, "dur": dur, "args": args})

    gpu_free = T0

    def launch(
        api: str, cbid: int, ts: float, dur: float, cat: str, name: str, gpu_dur: float, **extra: object
    ) -> float:
        nonlocal gpu_free
        corr = ids["corr"]
        ids["corr"] += 1
        cpu("cuda_runtime", api, ts, dur, cbid=cbid, correlation=corr)
        start = max(ts + 5.0, gpu_free)
        gpu_free = start + gpu_dur
        args = {"External id": ids["ext"] - 1, "device": DEVICE, "context": 1, "stream": STREAM, "correlation": corr}
        events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": DEVICE,
                "tid": STREAM,
                "ts": start,
                "dur": gpu_dur,
                "args": {**args, **extra},
            }
        )
        events.append({"ph": "s", "id": corr, "pid": PID, "tid": TID, "ts": ts, "cat": "ac2g", "name": "ac2g"})
        events.append(
            {"ph": "f", "id": corr, "pid": DEVICE, "tid": STREAM, "ts": start, "cat": "ac2g", "name": "ac2g", "bp": "e"}
        )
        return gpu_free

    t = T0
    for step in range(steps):
        start = t
        gpu_first = None
        for m in range(launches):
            at = start + 10.0 + 30.0 * m
            cpu("cpu_op", "aten::mm", at - 2.0, 20.0)
            end = launch(
                "cudaLaunchKernel",
                211,
                at,
                8.0,
                "kernel",
                KERNEL,
                kernel_us,
                grid=[1024, 1, 1],
                block=[128, 1, 1],
                **{"registers per thread": 16, "shared memory": 0},
            )
            gpu_first = gpu_first if gpu_first is not None else end - kernel_us
        step_end = start + 95.0
        if print_loss:
            at = start + 90.0
            copied = launch(
                "cudaMemcpyAsync",
                41,
                at + 2.0,
                5.0,
                "gpu_memcpy",
                "Memcpy DtoH (Device -> Pageable)",
                2.0,
                bytes=4,
                **{"memory bandwidth (GB/s)": 0.002},
            )
            cpu(
                "cuda_runtime",
                "cudaStreamSynchronize",
                at + 9.0,
                copied + 1.0 - (at + 9.0),
                cbid=131,
                correlation=ids["corr"],
            )
            ids["corr"] += 1
            item_end = copied + 3.0
            cpu("cpu_op", "aten::_local_scalar_dense", at + 1.0, item_end - 1.0 - (at + 1.0))
            cpu("cpu_op", "aten::item", at, item_end - at)
            step_end = item_end + 3.0
        cpu("user_annotation", f"step {step}", start, step_end - start)
        events.append(
            {
                "ph": "X",
                "cat": "gpu_user_annotation",
                "name": f"step {step}",
                "pid": DEVICE,
                "tid": STREAM,
                "ts": gpu_first,
                "dur": gpu_free - gpu_first,
                "args": {"External id": ids["ext"] - 1},
            }
        )
        t = step_end + 5.0
    cpu("cuda_runtime", "cudaDeviceSynchronize", t, gpu_free + 1.0 - t, cbid=165, correlation=ids["corr"])
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "handmade GPU-like trace (not measured)"}],
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def main() -> None:
    data = Path(__file__).resolve().parents[1] / "data" / "profile"
    for name, printing in (("plain", False), ("print", True)):
        path = data / f"runahead_gpu_like_{name}.json"
        path.write_text(json.dumps(make_trace(printing), indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
