"""The lecture's claims and five check-your-understanding questions, each answered by a figure of this run.

Every number here is read from the results of the report's sections (never written in): a claim is "held" when
its figure meets the stated criterion on this device, "not held" when it does not, and None (n/a) when this run
could not measure it (a failed section, a kernel that does not run here, or a claim about an asynchronous
device checked on the synchronous CPU).

`results` maps a section name to that section's results, as fuselab.report.sections writes them:
pitfalls {"cases"}, matmul {"rows", "regimes"}, mlp {"fits"}, gelu / softmax {"bench"}, profile / runahead
{"facts"}, roofline {"points"}.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from fuselab.bench.results import NOISY_MARK, row_is_noisy

Results = dict[str, dict]
Finding = tuple[str, float | None, bool | None]  # (figure, value, held)

NAIVE_SLOWER = 2.0  # naive at least this many times slower than the fused built-in
UNDERREPORT = 2.0  # timing without synchronize under-reports at least this much
FIRST_CALL = 2.0  # a loop without warm-up over-reports at least this much
LINEAR_R2 = 0.98  # MLP time linear in layers and steps
SMALL_MATMUL_GAP = 10.0  # a large matmul reaches at least this many times the TFLOP/s of a small one
NEAR_COPY_PCT = 80.0  # F.gelu's GB/s as % of the copy ceiling
MATCH = 1.25  # "as fast as": within this factor of the time
FUSION_GAIN = 2.0  # a fused GELU at least this many times faster than the naive one


class NotMeasured(Exception):
    """This run has no figure for a claim; the message says why."""


# ------------------------------------------------------------------------------------------------ reading results


def section(results: Results, name: str) -> dict:
    if name not in results:
        raise NotMeasured(f"section {name!r} did not finish")
    return results[name]


_READ: list[dict] = []  # the rows the claim being evaluated read (to say when one of them is noisy)


def _used(*rows: dict) -> None:
    _READ.extend(rows)


def noisy_note(rows: list[dict]) -> str:
    """'' when none of the rows is noisy, else what a verdict resting on them must say."""
    noisy = [r for r in rows if row_is_noisy(r)]
    if not noisy:
        return ""
    worst = max(noisy, key=lambda r: r["iqr_ms"] / r["median_ms"])
    what = " ".join(str(worst[k]) for k in ("impl", "dtype", "label", "n") if worst.get(k) is not None)
    return (
        f" {NOISY_MARK} rests on a noisy timing ({what}: IQR {100 * worst['iqr_ms'] / worst['median_ms']:.0f}% of the "
        "median); rerun on a quiet machine before trusting the verdict"
    )


def ok_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r.get("error") and r.get("median_ms")]


def bench_row(results: Results, op: str, impl: str, *, dtype: str = "float32", **match: object) -> dict:
    """The op's bench row for impl and dtype (matching `match`, e.g. approximate="tanh") with the most elements."""
    rows = [
        r
        for r in ok_rows(section(results, op).get("bench", []))
        if r["impl"] == impl and r["dtype"] == dtype and all(r.get(k) == v for k, v in match.items())
    ]
    if not rows:
        raise NotMeasured(f"no {op} {impl} {dtype} timing in this run")
    row = max(rows, key=lambda r: r["numel"])
    _used(row)
    return row


def gelu_row(results: Results, impl: str, numel: int | None = None) -> dict:
    """The fp32 tanh-GELU row of impl at `numel` elements (default: its largest)."""
    match = {"numel": numel} if numel is not None else {}
    return bench_row(results, "gelu", impl, approximate="tanh", **match)


def pairs(rows: list[dict], a: str, b: str, dtype: str = "float32") -> list[tuple[dict, dict]]:
    """(row of impl a, row of impl b) at every shape both measured in `dtype`."""
    by = {(r["impl"], tuple(r["shape"])): r for r in ok_rows(rows) if r["dtype"] == dtype}
    found = [(r, by[(b, s)]) for (impl, s), r in by.items() if impl == a and (b, s) in by]
    _used(*(r for pair in found for r in pair))
    return found


def pitfall_case(results: Results, prefer: str) -> dict:
    cases = [c for c in section(results, "pitfalls").get("cases", []) if not c.get("error")]
    if not cases:
        raise NotMeasured("no pitfall case finished")
    case = next((c for c in cases if prefer in c["label"]), cases[0])
    _used(case)
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
    _used(small, large)
    return small, large


def fmt_x(value: float) -> str:
    return f"{value:.3g}×"


def fmt_gbps(value: float) -> str:
    return f"{value:.0f} GB/s" if value >= 100 else f"{value:.3g} GB/s"


def fmt_ms(value: float) -> str:
    return f"{value * 1e3:.3g} µs" if value < 1 else f"{value:.4g} ms"


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


@claim(
    "The naive GELU (one kernel per op) is several times slower than the fused F.gelu.",
    "gelu",
    f"naive / F.gelu time ≥ {NAIVE_SLOWER:g}×",
)
def naive_gelu(results: Results) -> Finding:
    naive = gelu_row(results, "naive")
    torch_ = gelu_row(results, "torch", naive["numel"])
    ratio = naive["median_ms"] / torch_["median_ms"]
    figure = (
        f"fp32, {naive['numel']:,} elements: naive {fmt_ms(naive['median_ms'])}, F.gelu "
        f"{fmt_ms(torch_['median_ms'])}: {fmt_x(ratio)} slower"
    )
    return figure, ratio, ratio >= NAIVE_SLOWER


@claim(
    "GELU is memory-bound: the fused kernel runs near the copy bandwidth.",
    "gelu",
    f"F.gelu ≥ {NEAR_COPY_PCT:g}% of the copy GB/s",
)
def gelu_copy(results: Results) -> Finding:
    row = gelu_row(results, "torch")
    if row.get("pct_copy") is None:
        raise NotMeasured("no copy ceiling to compare with")
    figure = f"F.gelu fp32, {row['numel']:,} elements: {fmt_gbps(row['gbps'])} = {row['pct_copy']:.0f}% of copy"
    return figure, row["pct_copy"], row["pct_copy"] >= NEAR_COPY_PCT


@claim(
    "torch.compile fuses the naive GELU into one kernel and removes most of its cost.",
    "gelu",
    f"compiled ≥ {FUSION_GAIN:g}× faster than naive",
)
def compile_fuses(results: Results) -> Finding:
    naive = gelu_row(results, "naive")
    comp = gelu_row(results, "compile", naive["numel"])
    gain = naive["median_ms"] / comp["median_ms"]
    figure = f"torch.compile(naive) {fmt_ms(comp['median_ms'])} vs naive {fmt_ms(naive['median_ms'])}: {fmt_x(gain)}"
    return figure, gain, gain >= FUSION_GAIN


def _matches_f_gelu(impl: str, what: str) -> None:
    @claim(f"A hand-written {what} GELU kernel is about as fast as F.gelu.", "gelu", f"≤ {MATCH:g}× F.gelu's time")
    def matches(results: Results) -> Finding:
        torch_ = gelu_row(results, "torch")
        mine = gelu_row(results, impl, torch_["numel"])
        ratio = mine["median_ms"] / torch_["median_ms"]
        figure = f"{what} {fmt_ms(mine['median_ms'])} vs F.gelu {fmt_ms(torch_['median_ms'])}: {fmt_x(ratio)} its time"
        return figure, ratio, ratio <= MATCH


_matches_f_gelu("triton", "Triton")
_matches_f_gelu("cuda", "CUDA C++")


@claim(
    "The fused torch.softmax is several times faster than softmax written as separate ops.",
    "softmax",
    f"naive / torch.softmax time ≥ {NAIVE_SLOWER:g}× (median over widths)",
)
def softmax_fused(results: Results) -> Finding:
    found = pairs(section(results, "softmax").get("bench", []), "naive", "torch")
    if not found:
        raise NotMeasured("no naive and torch softmax timings at the same shape")
    ratio = statistics.median(n["median_ms"] / t["median_ms"] for n, t in found)
    return (
        f"fp32, median over {len(found)} widths: naive takes {fmt_x(ratio)} torch.softmax's time",
        ratio,
        (ratio >= NAIVE_SLOWER),
    )


@claim(
    "A one-row-per-program Triton softmax reaches torch.softmax's bandwidth at moderate widths.",
    "softmax",
    f"≥ {100 / MATCH:.0f}% of torch's GB/s (median over widths ≤ 16384)",
)
def softmax_triton(results: Results) -> Finding:
    found = [(t, b) for t, b in pairs(section(results, "softmax").get("bench", []), "triton", "torch")]
    found = [(t, b) for t, b in found if t["shape"][-1] <= 16384]
    if not found:
        raise NotMeasured("no Triton softmax timing at widths up to 16384 (Triton is timed on a GPU only)")
    ratio = statistics.median(t["gbps"] / b["gbps"] for t, b in found)
    return (
        f"fp32, median over {len(found)} widths: {100 * ratio:.0f}% of torch.softmax's GB/s",
        ratio,
        (ratio >= 1 / MATCH),
    )


@claim(
    "GELU and softmax are memory-bound; a large matmul is compute-bound.",
    "roofline",
    "every GELU/softmax point left of the ridge, the largest matmul right of it",
)
def roofline(results: Results) -> Finding:
    points = section(results, "roofline").get("points", [])
    ew = [p for p in points if p.get("family") in ("gelu", "softmax")]
    mm = [p for p in points if p.get("family") == "matmul"]
    if not ew or not mm:
        raise NotMeasured("no GELU/softmax or no matmul point to place")
    biggest = max(mm, key=lambda p: p["ai"])
    memory = sum(p["bound"] == "memory" for p in ew)
    figure = (
        f"{memory} of {len(ew)} GELU/softmax points are memory-bound (AI ≤ {max(p['ai'] for p in ew):.2g} FLOP/B); "
        f"{biggest['label']} (AI {biggest['ai']:.0f}) is {biggest['bound']}-bound at {biggest['pct_of_roof']:.0f}% "
        "of its roof"
    )
    return figure, biggest["ai"], memory == len(ew) and biggest["bound"] == "compute"


# ------------------------------------------------------------------------------------------------ questions


@dataclass(frozen=True)
class Question:
    text: str
    criterion: str
    answer: Callable[[Results], tuple[str, float | None, bool | None]]  # (answer, value, held)


def _q_sync(results: Results) -> tuple[str, float | None, bool | None]:
    figure, ratio, held = sync(results)
    text = (
        "Kernel launches are asynchronous: the call returns once the kernel is queued, not when it is done, so a "
        f"clock read without synchronize times the launch. Here {figure}."
    )
    return text, ratio, held


def _q_naive_gelu(results: Results) -> tuple[str, float | None, bool | None]:
    naive = gelu_row(results, "naive")
    torch_ = gelu_row(results, "torch", naive["numel"])
    ratio = naive["median_ms"] / torch_["median_ms"]
    text = (
        "GELU is memory-bound: its arithmetic is cheap, moving the tensor is not. The naive version runs each op as "
        "its own kernel, each reading and writing the whole tensor; F.gelu reads x once and writes y once. Here "
        f"naive {fmt_ms(naive['median_ms'])} ({fmt_gbps(naive['gbps'])} of useful traffic) against F.gelu "
        f"{fmt_ms(torch_['median_ms'])} ({fmt_gbps(torch_['gbps'])}): {fmt_x(ratio)} slower."
    )
    return text, ratio, ratio >= NAIVE_SLOWER


def _q_small_matmul(results: Results) -> tuple[str, float | None, bool | None]:
    small, large = matmul_pair(results)
    ratio = large["tflops"] / small["tflops"]
    text = (
        f"At n = {small['n']} a matmul is {small['flops'] / 1e6:.3g} MFLOP, done in {fmt_ms(small['median_ms'])}: "
        "launch overhead and too few tiles to fill the device dominate. At "
        f"n = {large['n']} ({large['flops'] / 1e9:.3g} GFLOP) there is work enough to keep every unit busy. Measured: "
        f"{small['tflops']:.3g} against {large['tflops']:.3g} TFLOP/s ({fmt_x(ratio)})."
    )
    return text, ratio, ratio >= SMALL_MATMUL_GAP


def _maybe_row(results: Results, impl: str, numel: int) -> list[dict]:
    try:
        return [gelu_row(results, impl, numel)]
    except NotMeasured:
        return []


def _q_fusion(results: Results) -> tuple[str, float | None, bool | None]:
    naive = gelu_row(results, "naive")
    fused = [r for impl in ("torch", "compile", "triton", "cuda") for r in _maybe_row(results, impl, naive["numel"])]
    if not fused:
        raise NotMeasured("no fused GELU was timed")
    best = min(fused, key=lambda r: r["median_ms"])
    gain = naive["median_ms"] / best["median_ms"]
    pct = f", {best['pct_copy']:.0f}% of the copy ceiling" if best.get("pct_copy") else ""
    text = (
        "Fewer trips through memory: a fused kernel reads its input once and writes its output once instead of once "
        f"per op, so its time falls toward the copy time. The fastest fused GELU here ({best['impl']}) takes "
        f"{fmt_ms(best['median_ms'])}{pct}: {fmt_x(gain)} faster than the naive one ({fmt_ms(naive['median_ms'])})."
    )
    return text, gain, gain >= FUSION_GAIN


def _q_compile(results: Results) -> tuple[str, float | None, bool | None]:
    comp = gelu_row(results, "compile")
    hand = _maybe_row(results, "triton", comp["numel"])
    rival = hand[0] if hand else gelu_row(results, "torch", comp["numel"])
    ratio = comp["median_ms"] / rival["median_ms"]
    name = "the Triton kernel" if hand else "F.gelu (Triton is not timed here)"
    parts = [f"GELU: compiled {fmt_ms(comp['median_ms'])} vs {name} {fmt_ms(rival['median_ms'])} ({fmt_x(ratio)})"]
    try:
        found = pairs(section(results, "softmax").get("bench", []), "compile", "torch")
    except NotMeasured:
        found = []
    if found:
        share = statistics.median(c["gbps"] / t["gbps"] for c, t in found)
        parts.append(
            f"softmax fp32: compiled at {100 * share:.0f}% of torch.softmax's GB/s (median, {len(found)} widths)"
        )
    text = (
        "When the op is a chain of elementwise or row-wise steps at static shapes, which Inductor fuses into the "
        "kernel one would write by hand (compile per shape: past dynamo's recompile limit it silently runs eager "
        "code). Here " + "; ".join(parts) + "."
    )
    return text, ratio, ratio <= MATCH


QUESTIONS: list[Question] = [
    Question(
        "Why must you synchronize before reading the clock?", f"under-report ≥ {UNDERREPORT:g}× on a GPU", _q_sync
    ),
    Question(
        "Why is the naive GELU slower than F.gelu although it does the same arithmetic?",
        f"≥ {NAIVE_SLOWER:g}× slower",
        _q_naive_gelu,
    ),
    Question(
        "Why does a matmul at n = 128 reach far fewer TFLOP/s than at n = 2048?",
        f"≥ {SMALL_MATMUL_GAP:g}× fewer TFLOP/s",
        _q_small_matmul,
    ),
    Question("What does fusing buy for a memory-bound op?", f"fused ≥ {FUSION_GAIN:g}× faster than naive", _q_fusion),
    Question(
        "When is torch.compile as good as a hand-written kernel?",
        f"compiled ≤ {MATCH:g}× the hand-written time",
        _q_compile,
    ),
]

_MISSING = (NotMeasured, LookupError, TypeError, ValueError, ZeroDivisionError)


def _why(exc: Exception) -> str:
    """NotMeasured says why itself; anything else (a missing or malformed field) is named with its type."""
    return str(exc) if isinstance(exc, NotMeasured) else f"{type(exc).__name__}: {exc}"


def evaluate_claims(results: Results) -> list[dict]:
    """Every claim: text, section, criterion, figure, value, held (True / False / None = not measured here)."""
    out = []
    for c in CLAIMS:
        _READ.clear()
        try:
            figure, value, held = c.measure(results)
        except _MISSING as exc:
            figure, value, held = f"not measured: {_why(exc)}", None, None
        note = noisy_note(_READ) if held is not None else ""
        figure += note
        out.append(
            {
                "claim": c.text,
                "section": c.section,
                "criterion": c.criterion,
                "figure": figure,
                "value": value,
                "held": held,
                "noisy": bool(note),
            }
        )
    return out


def answer_questions(results: Results) -> list[dict]:
    """The five questions: question, answer (quoting this run's figure), criterion, value, held."""
    out = []
    for q in QUESTIONS:
        _READ.clear()
        try:
            answer, value, held = q.answer(results)
        except _MISSING as exc:
            answer, value, held = f"not measured in this run: {_why(exc)}", None, None
        note = noisy_note(_READ) if held is not None else ""
        out.append(
            {
                "question": q.text,
                "answer": answer + note,
                "criterion": q.criterion,
                "value": value,
                "held": held,
                "noisy": bool(note),
            }
        )
    return out


def verdict(held: bool | None, noisy: bool = False) -> str:
    """The mark shown in the report; a verdict resting on a noisy timing carries NOISY_MARK."""
    mark = {True: "✅ held", False: "❌ not held", None: "– n/a"}[held]
    return f"{mark} {NOISY_MARK}" if noisy and held is not None else mark
