"""Draw docs/architecture.png from the code: fuselab's packages as boxes on their floors, imports as arrows.

    python scripts/draw_architecture.py [--out docs/architecture.png]

Each module under src/fuselab belongs to a package (`fuselab.bench`, `fuselab.ops`, one box for all op folders,
...); an arrow from A to B says A's modules import B's, its label how many import statements do. Nothing is run:
the imports are read with `ast`. Arrows that point up a floor are drawn red (none should exist).
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fuselab"

# Floors, bottom first: a package may import its own floor and the ones below.
FLOORS = [
    ["bench", "interpreter"],
    ["ops"],
    ["ops/<op>"],
    ["evaluate"],
    ["profile", "studies", "nn"],
    ["report"],
    ["cli", "gate"],
]


def package_of(module: str) -> str | None:
    """'fuselab.ops.gelu.triton' -> 'ops/<op>'; 'fuselab.ops.registry' -> 'ops'; None outside the drawing."""
    parts = module.split(".")
    if parts[0] != "fuselab" or len(parts) < 2:
        return None
    if parts[1] == "ops" and len(parts) > 2 and (SRC / "ops" / parts[2]).is_dir() and not parts[2].startswith("_"):
        return "ops/<op>"
    known = {name for floor in FLOORS for name in floor}
    return parts[1] if parts[1] in known else None


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[str]:
    """The fuselab modules `path` imports (absolute names)."""
    tree = ast.parse(path.read_text())
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found += [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
    return [name for name in found if name.startswith("fuselab")]


def edges() -> Counter:
    """(from package, to package) -> import statements, over every module under src/fuselab."""
    counts: Counter = Counter()
    for path in sorted(SRC.rglob("*.py")):
        source = package_of(module_name(path))
        for target in (package_of(name) for name in imports(path)):
            if source and target and target != source:
                counts[source, target] += 1
    return counts


def draw(counts: Counter, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floor_of = {name: i for i, floor in enumerate(FLOORS) for name in floor}
    where = {}
    for i, floor in enumerate(FLOORS):
        for j, name in enumerate(floor):
            where[name] = ((j + 1) / (len(floor) + 1), 0.08 + 0.84 * i / (len(FLOORS) - 1))
    fig, ax = plt.subplots(figsize=(11, 8))
    for (a, b), n in counts.items():
        (x0, y0), (x1, y1) = where[a], where[b]
        up = floor_of[b] > floor_of[a]
        ax.annotate(
            "", xy=(x1, y1), xytext=(x0, y0),
            arrowprops={"arrowstyle": "->", "color": "red" if up else "0.55", "lw": 0.6 + 0.25 * n ** 0.5,
                        "shrinkA": 18, "shrinkB": 18, "connectionstyle": "arc3,rad=0.08"},
        )  # fmt: skip
        ax.text(0.6 * x0 + 0.4 * x1, 0.6 * y0 + 0.4 * y1, str(n), fontsize=7, color="0.35", ha="center")
    for name, (x, y) in where.items():
        ax.text(x, y, f"fuselab.{name}".replace("/", "."), ha="center", va="center", fontsize=10,
                bbox={"boxstyle": "round,pad=0.5", "fc": "#eef3fb", "ec": "#4a6fa5"})  # fmt: skip
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    ax.set_title("fuselab: packages on their floors (arrows: imports, with their count; red: one going up)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    args = p.parse_args(argv)
    counts = edges()
    draw(counts, args.out)
    up = [f"{a} -> {b}" for (a, b) in counts if FLOORS_INDEX[b] > FLOORS_INDEX[a]]
    print(f"wrote {args.out}: {len(counts)} arrows" + (f"; going up: {', '.join(up)}" if up else ""))
    return 1 if up else 0


FLOORS_INDEX = {name: i for i, floor in enumerate(FLOORS) for name in floor}

if __name__ == "__main__":
    raise SystemExit(main())
