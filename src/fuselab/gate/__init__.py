"""The GPU gate: one run that proves the tree works on a GPU, before every landing (`make gpu-gate`, or
`scripts/gpu_gate.sh` on the GPU machine).

It runs the whole `pytest -m gpu` suite (in a process of its own, beside the rest: a test that does not finish within
the budget is a failure, named), `check` of every op x impl x dtype on its edge shapes in three layouts and on a shape
past 2^31 elements, every fuselab.nn module and the CS336 classes' leaderboard step under torch.compile, a small GPT
of fuselab's drop-ins against its torch.nn twin, and one short bench of every op x impl; and writes one
`GateRecord` to benchmarks/results/<gpu>/gate.json. A CPU test (tests/test_gate_result.py) fails CI when that file
shows a failure or was made from other sources than the tree's.
"""

from fuselab.gate.record import GROUPS, Check, GateRecord, gpu_folder, source_digest

__all__ = ["GROUPS", "Check", "GateRecord", "gpu_folder", "source_digest"]
