"""Whether the softmax CUDA binding's refusals raise or crash the process (docs/ops/softmax.md, "Open: the binding's
error messages with numbers crash"). Each case runs in a fresh process, calling the extension directly, past the
Python checks that users' calls meet first, and a minimal extension of three refusals built with load_inline (none of
fuselab's code); prints the exit code and the error's first line per case.

    PYTHONPATH=src python3 scripts/probe_binding_errors.py [--triton-first]

--triton-first imports triton before torch's extension loads (the import order is a candidate cause)."""

from __future__ import annotations

import subprocess
import sys

CASES = {  # name -> a call the binding refuses, and what its message holds
    "cpu tensor (a device)": "x = torch.randn(3, 5); ext.forward(x, torch.empty_like(x))",
    "float64 (a dtype name)": "x = torch.randn(3, 5, device='cuda', dtype=torch.float64); ext.forward(x, x.clone())",
    "3-d tensor (sizes)": "x = torch.randn(2, 3, 5, device='cuda'); ext.forward(x, torch.empty_like(x))",
    "shape mismatch (sizes)": "x = torch.randn(3, 5, device='cuda'); ext.forward(x, torch.empty(3, 6, device='cuda'))",
}
# A minimal extension of three refusals, none of fuselab's code: does any extension built here crash on numbers?
INLINE = r"""
#include <torch/extension.h>
void refuse_text(const torch::Tensor& t) { TORCH_CHECK(false, "device ", t.device()); }
void refuse_int(int64_t n) { TORCH_CHECK(false, "n = ", n); }
void refuse_sizes(const torch::Tensor& t) { TORCH_CHECK(false, "sizes ", t.sizes()); }
void refuse_int_text(int64_t n) { TORCH_CHECK(false, "n = " + std::to_string(n)); }
void refuse_float_text(double v) { TORCH_CHECK(false, "v = " + std::to_string(v)); }
"""
INLINE_CASES = {
    "inline: text": "ext.refuse_text(torch.ones(2))",
    "inline: an integer": "ext.refuse_int(5)",
    "inline: sizes": "ext.refuse_sizes(torch.ones(2, 3))",
    "inline: an integer by std::to_string": "ext.refuse_int_text(5)",
    "inline: a double by std::to_string": "ext.refuse_float_text(0.5)",
}
FUNCTIONS = ["refuse_text", "refuse_int", "refuse_sizes", "refuse_int_text", "refuse_float_text"]
LOAD_INLINE = (
    "from torch.utils.cpp_extension import load_inline\n"
    f"ext = load_inline('probe_refusals', cpp_sources=INLINE, functions={FUNCTIONS!r})\n"
)


def main() -> None:
    first = "import triton\n" if "--triton-first" in sys.argv else ""
    fuselab = "from fuselab.ops.softmax import cuda\next = cuda.extension()\n"
    inline = f"INLINE = {INLINE!r}\n{LOAD_INLINE}"
    cases = [(name, fuselab, call) for name, call in CASES.items()]
    cases += [(name, inline, call) for name, call in INLINE_CASES.items()]
    for name, load, call in cases:
        code = (
            f"{first}import torch\n{load}"
            f"try:\n    {call}\n    print('no error')\nexcept Exception as e:\n"
            "    print(type(e).__name__, str(e).splitlines()[0][:160])\n"
        )
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        last = (run.stdout + run.stderr).strip().splitlines()[-1:] or [""]
        print(f"{name}: exit {run.returncode}: {last[0]}", flush=True)


if __name__ == "__main__":
    main()
