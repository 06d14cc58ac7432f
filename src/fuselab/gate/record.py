"""What a gate run writes: one typed record (`GateRecord`) of checks (`Check`), as JSON, and the digest that ties it
to the source tree it ran on."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

# upstream: failed in PyTorch's own kernels (an impl marked Impl.upstream: a baseline), reported but not fuselab's
Outcome = Literal["pass", "fail", "skip", "upstream"]
GROUPS = ("pytest", "check", "compile", "model", "bench")  # what every gate run covers, in the order it reports
SOURCE_ROOT = Path(__file__).resolve().parents[1]  # src/fuselab: what the digest covers


@dataclass
class Check:
    """One thing the gate tried. figure: its measured error (relative, against float64 or eager) or None;
    detail: what was compared, or why it failed or was skipped; seconds: how long it took."""

    group: str
    name: str
    outcome: Outcome
    figure: float | None = None
    detail: str = ""
    seconds: float = 0.0


@dataclass
class GateRecord:
    """A gate run: where and on what it ran, and every check with its outcome."""

    revision: str  # the git commit of the tree (its src/ digest says whether the tree was that commit's)
    src_digest: str  # source_digest() of src/fuselab as it ran
    date: str  # UTC, ISO 8601
    environment: dict[str, object]  # gpu, driver, torch, triton, cuda, python (fuselab.bench.env.environment)
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.outcome == "fail"]

    def counts(self) -> dict[str, dict[str, int]]:
        """{group: {outcome: how many}}."""
        out: dict[str, dict[str, int]] = {}
        for c in self.checks:
            group = out.setdefault(c.group, {"pass": 0, "fail": 0, "skip": 0, "upstream": 0})
            group[c.outcome] += 1
        return out

    def to_json(self) -> dict:
        return {**asdict(self), "counts": self.counts(), "failed": len(self.failures)}

    def write(self, path: Path) -> None:
        """Write the record to `path` (its folder made if missing), replacing it whole."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> GateRecord:
        data = json.loads(Path(path).read_text())
        checks = [Check(**c) for c in data.pop("checks", [])]
        fields = {k: data[k] for k in ("revision", "src_digest", "date", "environment", "seconds") if k in data}
        return cls(**fields, checks=checks)


def source_digest(root: Path = SOURCE_ROOT) -> str:
    """sha256 over the path and bytes of every source file under `root` (caches and build outputs left out): the
    same on the GPU machine's copy of a tree as on a clone of its commit."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or path.suffix in (".pyc", ".so", ".o") or rel.parts[0].endswith(".egg-info"):
            continue
        digest.update(rel.as_posix().encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def gpu_folder(gpu_name: str) -> str:
    """The results folder of a GPU: 'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100_80gb_hbm3'."""
    words = gpu_name.lower().replace("nvidia", " ").split()
    return "_".join("".join(c if c.isalnum() else "_" for c in w) for w in words).strip("_") or "gpu"
