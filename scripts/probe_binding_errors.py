"""Whether the softmax CUDA binding's refusals raise or crash the process (docs/ops/softmax.md, "Open: the binding's
error messages with numbers crash"). Each case runs in a fresh process, calling the extension directly, past the
Python checks that users' calls meet first; prints the exit code and the error's first line per case.

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


def main() -> None:
    first = "import triton\n" if "--triton-first" in sys.argv else ""
    for name, call in CASES.items():
        code = (
            f"{first}import torch\nfrom fuselab.ops.softmax import cuda\next = cuda.extension()\n"
            f"try:\n    {call}\n    print('no error')\nexcept Exception as e:\n"
            "    print(type(e).__name__, str(e).splitlines()[0][:160])\n"
        )
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        last = (run.stdout + run.stderr).strip().splitlines()[-1:] or [""]
        print(f"{name}: exit {run.returncode}: {last[0]}", flush=True)


if __name__ == "__main__":
    main()
