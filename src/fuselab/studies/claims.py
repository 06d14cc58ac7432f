"""The lecture's claims and its five check-your-understanding questions, each answered by a figure of this run.

Every number here is read from the results of the report's sections (never written in): a claim is "held" when
its figure meets the stated criterion on this device, "not held" when it does not, and None (n/a) when this run
could not measure it (a failed section, a kernel that does not run here, or a claim about an asynchronous
device checked on the synchronous CPU).

The claims about the harness (pitfalls, matmul, MLP, profile, run-ahead) are written here; the claims about ops are
generic, made for every registered op from its impls (naive against the fused built-in, torch.compile against
naive, hand-written kernels against the built-in, the roofline), plus any an op declares in its folder
(`Op.claims`, `Op.questions`). `results` maps a section name to that section's results, as the report writes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fuselab.bench.record import Record, Row, value
from fuselab.bench.results import ABOVE_MARK, NOISY_MARK, row_is_noisy
from fuselab.bench.shapes import format_shape
from fuselab.evaluate import CEILING_SHARES, above_ceiling
from fuselab.ops.findings import (
    READ,
    Finding,
    NotMeasured,
    Results,
    fmt_gbps,
    fmt_ms,
    fmt_x,
    median_ratio,
    ok_rows,
    op_rows,
    pairs,
    section,
    used,
)
from fuselab.ops.registry import Op, all_ops

__all__ = ["NotMeasured", "answer_questions", "evaluate_claims", "fmt_gbps", "verdict"]

NAIVE_SLOWER = 2.0  # naive at least this many times slower than the fused built-in
UNDERREPORT = 2.0  # timing without synchronize under-reports at least this much
FIRST_CALL = 2.0  # a loop without warm-up over-reports at least this much
LINEAR_R2 = 0.98  # MLP time linear in layers and steps
SMALL_MATMUL_GAP = 10.0  # a large matmul reaches at least this many times the TFLOP/s of a small one
MATCH = 1.25  # "as fast as": within this factor of the time
FUSION_GAIN = 2.0  # torch.compile at least this many times faster than the naive op


def noisy_note(rows: list[Record]) -> str:
    """'' when none of the rows is noisy, else what a verdict resting on them must say."""
    noisy = [r for r in rows if row_is_noisy(r)]
    if not noisy:
        return ""

    def spread(r: Record) -> float:
        return value(r, "iqr_ms") / value(r, "median_ms")  # type: ignore[operator]

    worst = max(noisy, key=spread)
    what = " ".join(str(value(worst, k)) for k in ("impl", "dtype", "label", "n") if value(worst, k) is not None)
    return (
        f" {NOISY_MARK} rests on a noisy timing ({what}: IQR {100 * spread(worst):.0f}% of the "
        "median); rerun on a quiet machine before trusting the verdict"
    )


def past_note(rows: list[Record]) -> str:
    """'' when no row's rate passes its ceiling (`fuselab.evaluate.above_ceiling`), else what a verdict resting
    on them must say."""
    past = [(r, above) for r in rows if isinstance(r, Row) and r.measured and (above := above_ceiling(r))]
    if not past:
        return ""
    row, (pct, share) = max(past, key=lambda p: p[1][0])
    what = f"{row.case.op} {row.case.impl} {row.case.dtype} {format_shape(row.case.shape)}"
    ceiling = CEILING_SHARES[share].split(":")[0]
    return (
        f" {ABOVE_MARK} rests on a rate past its ceiling ({what}: {pct:.0f}% of {ceiling}), which no hardware "
        "allows: a cache held the data, the ceiling was measured low, or the time is wrong"
    )


def pitfall_case(results: Results, prefer: str) -> dict:
    cases = [c for c in section(results, "pitfalls").get("cases", []) if not c.get("error")]
    if not cases:
        raise NotMeasured("no pitfall case finished")
    case = next((c for c in cases if prefer in c["label"]), cases[0])
    used(case)
    return case


def matmul_pair(results: Results) -> tuple[dict, dict]:
    """(small, large) matmul rows of the first dtype: n = 128 (or the nearest above) and 2048 (or the largest)."""
    rows = ok_rows(section(results, "matmul").get("rows", []))
    if not rows:
        raise NotMeasured("no matmul timing")
    rows = sorted((r for r in rows if r["dtype"] == rows[0]["dtype"]), key=lambda r: r["n"])
    small = next((r for r in rows if r["n"] >= 128), rows[0])
    large = next((r for r in rows if r["n"] == 2048), rows[-1])
    if large["n"] <= small["n"]:
        raise NotMeasured("no matmul sizes past 128 were measured")
    used(small, large)
    return small, large


# ------------------------------------------------------------------------------------------------ claims


@dataclass(frozen=True)
class Claim:
    text: str
    section: str
    criterion: str
    measure: Callable[[Results], Finding]


CLAIMS: list[Claim] = []


def claim(text: str, section: str, criterion: str) -> Callable[[Callable[[Results], Finding]], Callable]:
    def register(fn: Callable[[Results], Finding]) -> Callable[[Results], Finding]:
        CLAIMS.append(Claim(text, section, criterion, fn))
        return fn

    return register


@claim(
    "Without warm-up, the first call's one-time costs (compilation, set-up, clocks) pollute the timing.",
    "pitfalls",
    f"first 10 calls average ≥ {FIRST_CALL:g}× the warm time",
)
def warmup(results: Results) -> Finding:
    c = pitfall_case(results, "compile")
    ratio = c["no_warmup_ratio"]
    figure = (
        f"{c['label']}: first call {fmt_ms(c['first_call_ms'])}; the first calls average {fmt_ms(c['no_warmup_ms'])}"
        f" against {fmt_ms(c['correct_ms'])} warm: {fmt_x(ratio)} too large"
    )
    return figure, ratio, ratio >= FIRST_CALL


@claim(
    "Timing a GPU kernel without synchronize measures only its launch and under-reports its time.",
    "pitfalls",
    f"correct / unsynced ≥ {UNDERREPORT:g}× (on a GPU)",
)
def sync(results: Results) -> Finding:
    c = pitfall_case(results, "matmul")
    ratio = c["no_sync_underreport"]
    figure = f"{c['label']}: {fmt_ms(c['correct_ms'])} correct, {fmt_ms(c['no_sync_ms'])} without synchronize"
    if c.get("synchronous_device"):
        return figure + " (n/a: the CPU runs ops synchronously)", ratio, None
    return f"{figure}: {fmt_x(ratio)} too small", ratio, ratio >= UNDERREPORT


@claim(
    "Matmul time is nearly flat for small sizes (launch and under-use bound), then grows as n³.",
    "matmul",
    "log-log slope < 1.5 over the smallest sizes, ≥ 2.5 over the largest",
)
def matmul_regimes(results: Results) -> Finding:
    dtype, reg = next(iter(section(results, "matmul")["regimes"].items()))
    small, large = reg["small_exponent"], reg["large_exponent"]
    figure = (
        f"{dtype}: time ∝ n^{small:.2f} over the smallest sizes (within 2× of the smallest up to n = "
        f"{reg['flat_until']}), n^{large:.2f} over the largest"
    )
    return figure, large, small < 1.5 and large >= 2.5


@claim(
    "A small matmul reaches a small fraction of the TFLOP/s of a large one.",
    "matmul",
    f"large / small TFLOP/s ≥ {SMALL_MATMUL_GAP:g}×",
)
def matmul_small(results: Results) -> Finding:
    small, large = matmul_pair(results)
    ratio = large["tflops"] / small["tflops"]
    figure = (
        f"{small['dtype']}: n = {small['n']}: {small['tflops']:.3g} TFLOP/s; n = {large['n']}: "
        f"{large['tflops']:.3g} TFLOP/s ({fmt_x(ratio)})"
    )
    return figure, ratio, ratio >= SMALL_MATMUL_GAP


@claim(
    "An MLP's forward + backward time is linear in its number of layers and of steps.",
    "mlp",
    f"R² ≥ {LINEAR_R2} for both",
)
def mlp_linear(results: Results) -> Finding:
    fits = section(results, "mlp").get("fits", {})
    if "layers" not in fits or "steps" not in fits:
        raise NotMeasured("the MLP sweeps over layers and steps did not both finish")
    r2 = min(fits["layers"]["r2"], fits["steps"]["r2"])
    return (
        f"R² of the fitted line: layers {fits['layers']['r2']:.4f}, steps {fits['steps']['r2']:.4f}",
        r2,
        (r2 >= LINEAR_R2),
    )


@claim(
    "The profiler shows what really runs: cdist is several kernels, and small and large matmuls run different ones.",
    "profile",
    "cdist ≥ 2 kernels; the 128 and 2048 matmul kernels differ",
)
def kernels(results: Results) -> Finding:
    facts = section(results, "profile").get("facts", {})
    if facts.get("cdist_kernels") is None:
        raise NotMeasured("the profile section reported no kernels for cdist")
    n = facts["cdist_kernels"]
    figure = f"torch.cdist ran {n} distinct {'kernels' if facts.get('gpu') else 'operators (CPU)'}"
    mm = facts.get("matmul_kernels") or {}
    differ = len(set(mm.values())) > 1 if len(mm) > 1 else None
    if mm:
        figure += "; matmul " + "; ".join(f"{k}: {v}" for k, v in mm.items())
    if not facts.get("gpu"):
        return figure + " (kernel names need a GPU)", n, None
    return figure, n, n >= 2 and bool(differ)


@claim(
    "The CPU runs ahead of the GPU: launches return at once, until something synchronizes.",
    "runahead",
    "the CPU's lead over the GPU > 0",
)
def runahead(results: Results) -> Finding:
    facts = section(results, "runahead").get("facts", {})
    lead = facts.get("lead_ms")
    if lead is None:
        raise NotMeasured("the run-ahead study reported no lead (it needs a GPU)")
    figure = f"the CPU ran up to {fmt_ms(lead)} ahead of the GPU"
    if facts.get("sync_wait_ms"):
        figure += f"; synchronizing made it wait {fmt_ms(facts['sync_wait_ms'])}"
    return figure, lead, lead > 0


def _compare_dtype(op: Op) -> str:
    """Compute-bound ops are compared in bf16 (their tensor-core dtype), memory-bound ones in fp32."""
    return "bfloat16" if op.bound == "compute" else "float32"


def _op_pairs(results: Results, op: Op, a: str, b: str) -> list[tuple[Row, Row]]:
    found = pairs(op_rows(results, op.name), a, b, _compare_dtype(op), **op.default_options())
    if not found:
        raise NotMeasured(f"no {op.name} {a} and {b} timings at the same shape in {_compare_dtype(op)}")
    return found


def op_claims(op: Op) -> list[Claim]:
    """The lecture's claims about fusion, made for `op` from the impls it has."""
    made = []
    base = op.defaults.baseline
    dtype = "bf16" if op.bound == "compute" else "fp32"
    if "naive" in op.impls and base in op.impls:

        def fused(results: Results) -> Finding:
            found = _op_pairs(results, op, "naive", base)
            ratio = median_ratio(found)
            return (
                f"{dtype}, median over {len(found)} shapes: naive takes {fmt_x(ratio)} {base}'s time",
                ratio,
                (ratio >= NAIVE_SLOWER),
            )

        made.append(
            Claim(
                f"{op.name}: the fused built-in ({base}) is several times faster than the op written as separate ops.",
                op.name,
                f"naive / {base} time ≥ {NAIVE_SLOWER:g}× (median over shapes)",
                fused,
            )
        )
    if op.bound == "memory" and "naive" in op.impls and "compile" in op.impls:

        def compiled(results: Results) -> Finding:
            found = _op_pairs(results, op, "naive", "compile")
            gain = median_ratio(found)
            return (
                f"{dtype}, median over {len(found)} shapes: torch.compile(naive) {fmt_x(gain)} faster",
                gain,
                (gain >= FUSION_GAIN),
            )

        made.append(
            Claim(
                f"{op.name}: torch.compile fuses the naive version into one kernel and removes most of its cost.",
                op.name,
                f"compiled ≥ {FUSION_GAIN:g}× faster than naive",
                compiled,
            )
        )
    for impl, what in (("triton", "Triton"), ("cuda", "CUDA C++")):
        if impl not in op.impls or base not in op.impls:
            continue

        def matches(results: Results, impl: str = impl, what: str = what) -> Finding:
            found = _op_pairs(results, op, impl, base)
            ratio = median_ratio(found)
            return (
                f"{dtype}, median over {len(found)} shapes: {what} takes {fmt_x(ratio)} {base}'s time",
                ratio,
                (ratio <= MATCH),
            )

        made.append(
            Claim(
                f"{op.name}: a hand-written {what} kernel is about as fast as {base}.",
                op.name,
                f"≤ {MATCH:g}× {base}'s time (median over shapes)",
                matches,
            )
        )
    made += [Claim(text, op.name, criterion, fn) for text, criterion, fn in op.claims]
    return made


@claim(
    "Elementwise and row-wise ops are memory-bound; a large matmul (and attention) is compute-bound.",
    "roofline",
    "every memory-bound op's point left of the ridge, the largest matmul and compute-bound ops' largest right of it",
)
def roofline(results: Results) -> Finding:
    points = section(results, "roofline").get("points", [])
    bounds = {op.name: op.bound for op in all_ops()}
    memory_ops = [p for p in points if bounds.get(p.get("family")) == "memory"]
    compute = [p for p in points if p.get("family") == "matmul" or bounds.get(p.get("family")) == "compute"]
    if not memory_ops or not compute:
        raise NotMeasured("no memory-bound op or no matmul point to place")
    largest = {}
    for p in compute:
        if p["family"] not in largest or p["flops"] > largest[p["family"]]["flops"]:
            largest[p["family"]] = p
    memory = sum(p["bound"] == "memory" for p in memory_ops)
    right = [p for p in largest.values() if p["bound"] == "compute"]
    figure = (
        f"{memory} of {len(memory_ops)} memory-bound op points are left of the ridge (AI ≤ "
        f"{max(p['ai'] for p in memory_ops):.2g} FLOP/B); "
        + "; ".join(f"{p['label']} (AI {p['ai']:.0f}) is {p['bound']}-bound" for p in largest.values())
    )
    return figure, len(right), memory == len(memory_ops) and len(right) == len(largest)


# ------------------------------------------------------------------------------------------------ questions


def _q_sync(results: Results) -> tuple[str, float | None, bool | None]:
    figure, ratio, held = sync(results)
    text = (
        "Kernel launches are asynchronous: the call returns once the kernel is queued, not when it is done, so a "
        f"clock read without synchronize times the launch. Here {figure}."
    )
    return text, ratio, held


def _q_runahead(results: Results) -> tuple[str, float | None, bool | None]:
    facts = section(results, "runahead").get("facts", {})
    if facts.get("lead_ms") is None or not facts.get("gpu"):
        raise NotMeasured("the run-ahead study needs a GPU (on the CPU every op runs synchronously)")
    plain, printed = facts["wall_plain_ms"], facts["wall_print_ms"]
    text = (
        "Each launch returns as soon as the kernel is queued, so Python goes on to the next op while the GPU works: "
        "the host's overhead is hidden as long as it stays ahead. Anything that needs a GPU value on the host "
        "(`loss.item()`, a print of the loss, `.cpu()`, `torch.cuda.synchronize`) makes it wait for the queue "
        "to drain, "
        f"and from then on the overhead adds up. Here the plain loop ran up to {fmt_ms(facts['lead_ms'])} "
        f"({facts.get('steps_ahead_max') or 0:.3g} steps) ahead of the GPU; printing the loss each step added "
        f"{facts.get('added_syncs') or 0} synchronizations, {fmt_ms(facts.get('sync_wait_ms') or 0.0)} of waiting, "
        f"and the loop took {fmt_ms(printed)} against {fmt_ms(plain)}."
    )
    return text, facts["lead_ms"], facts["lead_ms"] > 0


@dataclass(frozen=True)
class Question:
    order: int
    text: str
    criterion: str
    answer: Callable[[Results], tuple[str, float | None, bool | None]]  # (answer, value, held)


def questions() -> list[Question]:
    """The lecture's five questions in its order: two about the harness answered here, the others by the ops that
    declare them (`Op.questions`: (order, question, criterion, answer))."""
    found = [
        Question(
            1,
            "Why synchronize before reading the clock in a GPU benchmark?",
            f"under-report ≥ {UNDERREPORT:g}× on a GPU",
            _q_sync,
        ),
        Question(
            3,
            "How does the CPU running ahead of the GPU hide Python's overhead, and what makes it stop?",
            "the CPU's lead > 0",
            _q_runahead,
        ),
    ]
    found += [Question(*q) for op in all_ops() for q in op.questions]
    return sorted(found, key=lambda q: q.order)


_MISSING = (NotMeasured, LookupError, TypeError, ValueError, ZeroDivisionError)


def _why(exc: Exception) -> str:
    """NotMeasured says why itself; anything else (a missing or malformed field) is named with its type."""
    return str(exc) if isinstance(exc, NotMeasured) else f"{type(exc).__name__}: {exc}"


def evaluate_claims(results: Results) -> list[dict]:
    """Every claim: text, section, criterion, figure, value, held (True / False / None = not measured here)."""
    out = []
    for c in [*CLAIMS, *(made for op in all_ops() for made in op_claims(op))]:
        READ.clear()
        try:
            figure, value, held = c.measure(results)
        except _MISSING as exc:
            figure, value, held = f"not measured: {_why(exc)}", None, None
        note = noisy_note(READ) if held is not None else ""
        past = past_note(READ) if held is not None else ""
        figure += note + past
        out.append(
            {
                "claim": c.text,
                "section": c.section,
                "criterion": c.criterion,
                "figure": figure,
                "value": value,
                "held": held,
                "noisy": bool(note),
                "past": bool(past),
            }
        )
    return out


def answer_questions(results: Results) -> list[dict]:
    """The lecture's questions: question, answer (quoting this run's figure), criterion, value, held."""
    out = []
    for q in questions():
        READ.clear()
        try:
            answer, value, held = q.answer(results)
        except _MISSING as exc:
            answer, value, held = f"not measured in this run: {_why(exc)}", None, None
        note = noisy_note(READ) if held is not None else ""
        past = past_note(READ) if held is not None else ""
        out.append(
            {
                "question": q.text,
                "answer": answer + note + past,
                "criterion": q.criterion,
                "value": value,
                "held": held,
                "noisy": bool(note),
                "past": bool(past),
            }
        )
    return out


def verdict(held: bool | None, noisy: bool = False, past: bool = False) -> str:
    """The mark shown in the report; a verdict resting on a noisy timing carries NOISY_MARK, one resting on a rate
    past its ceiling ABOVE_MARK."""
    mark = {True: "✓ held", False: "✗ not held", None: "– n/a"}[held]  # text marks: no emoji font needed
    if held is None:
        return mark
    return " ".join([mark, *([NOISY_MARK] if noisy else []), *([ABOVE_MARK] if past else [])])
