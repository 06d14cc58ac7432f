"""fuselab: benchmark correctly, profile, write fused GPU kernels, and prove them right and fast."""

import os

__version__ = "0.1.0"

# Triton kernels run on a machine without a GPU only under Triton's interpreter, which must be chosen before
# any kernel is defined. Without a GPU there is nothing else Triton could run on, so choose it here.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

if os.environ.get("TRITON_INTERPRET") == "1":
    from fuselab import interpreter

    interpreter.prepare()
