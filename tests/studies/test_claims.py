import copy

import pytest

from fuselab.ops import all_ops
from fuselab.studies.claims import answer_questions, evaluate_claims, questions, verdict


def gelu_rows(naive_ms: float, torch_ms: float, compile_ms: float, triton_ms: float, cuda_ms: float) -> list[dict]:
    n = 2**28
    rows = []
    for impl, t in (
        ("naive", naive_ms),
        ("torch", torch_ms),
        ("compile", compile_ms),
        ("triton", triton_ms),
        ("cuda", cuda_ms),
    ):
        gbps = 8 * n / (t * 1e-3) / 1e9
        rows.append(
            {
                "impl": impl,
                "dtype": "float32",
                "shape": [n],
                "numel": n,
                "approximate": "tanh",
                "median_ms": t,
                "gbps": gbps,
                "pct_copy": 100 * gbps / 4270,
                "error": None,
            }
        )
    return rows


def softmax_rows(elementwise_gbps: float = 300.0) -> list[dict]:
    """fp32 rows at three widths; the element-per-thread kernel's GB/s counts the op's 2-pass minimum of bytes."""
    rows = []
    impls = (
        ("naive", 900.0),
        ("torch", 4000.0),
        ("compile", 4050.0),
        ("triton", 3950.0),
        ("triton-elementwise", elementwise_gbps),
    )
    for w in (1024, 4096, 65536):
        for impl, gbps in impls:
            t = 2 * 2**26 * 4 / (gbps * 1e9) * 1e3
            rows.append(
                {
                    "impl": impl,
                    "dtype": "float32",
                    "shape": [2**26 // w, w],
                    "numel": 2**26,
                    "bytes": 2 * 2**26 * 4,
                    "median_ms": t,
                    "gbps": gbps,
                    "error": None,
                }
            )
    return rows


def h200_like() -> dict:
    """Results shaped as the report's sections write them, with figures like an H200's."""
    return {
        "pitfalls": {
            "cases": [
                {
                    "label": "matmul 4096³ bf16",
                    "first_call_ms": 3.0,
                    "no_warmup_ms": 0.5,
                    "no_sync_ms": 0.006,
                    "correct_ms": 0.21,
                    "no_warmup_ratio": 2.4,
                    "no_sync_underreport": 35.0,
                    "synchronous_device": False,
                },
                {
                    "label": "gelu torch.compile 2^24 fp32",
                    "first_call_ms": 4000.0,
                    "no_warmup_ms": 400.0,
                    "no_sync_ms": 0.01,
                    "correct_ms": 0.04,
                    "no_warmup_ratio": 10000.0,
                    "no_sync_underreport": 4.0,
                    "synchronous_device": False,
                },
            ]
        },
        "matmul": {
            "rows": [
                {
                    "n": n,
                    "dtype": "float32",
                    "median_ms": t,
                    "flops": 2 * n**3,
                    "tflops": 2 * n**3 / (t * 1e-3) / 1e12,
                    "error": None,
                }
                for n, t in ((64, 0.006), (128, 0.007), (256, 0.009), (1024, 0.06), (2048, 0.4), (4096, 3.0))
            ],
            "regimes": {
                "float32": {"small_exponent": 0.3, "large_exponent": 2.9, "flat_until": 256, "cubic_from": 1024}
            },
        },
        "mlp": {"fits": {"layers": {"r2": 0.999}, "steps": {"r2": 0.9999}}},
        "gelu": {"bench": gelu_rows(5.49, 0.509, 0.589, 0.508, 1.009)},
        "softmax": {"bench": softmax_rows()},
        "profile": {
            "facts": {
                "gpu": True,
                "cdist_kernels": 4,
                "matmul_kernels": {"128": "gemm_small", "2048": "sm90_xmma_gemm"},
            }
        },
        "runahead": {
            "facts": {
                "gpu": True,
                "lead_ms": 12.0,
                "steps_ahead_max": 3.0,
                "sync_wait_ms": 30.0,
                "wall_plain_ms": 40.0,
                "wall_print_ms": 70.0,
                "added_syncs": 20,
            }
        },
        "inspect": {
            "items": [
                {
                    "op": "gelu",
                    "impl": "triton",
                    "kernels": [{"name": "gelu_forward_kernel", "loads": [{"instr": "ld.global.v4.b32", "bytes": 16}]}],
                }
            ]
        },
        "roofline": {
            "points": [
                {"label": "gelu torch fp32", "family": "gelu", "ai": 1.1, "bound": "memory", "pct_of_roof": 98.0},
                {"label": "softmax torch fp32", "family": "softmax", "ai": 0.6, "bound": "memory", "pct_of_roof": 90.0},
                {
                    "label": "matmul 8192 bf16",
                    "family": "matmul",
                    "flops": 2 * 8192**3,
                    "ai": 2730.0,
                    "bound": "compute",
                    "pct_of_roof": 80.0,
                },
            ]
        },
    }


def by_text(claims: list[dict]) -> dict[str, dict]:
    return {c["claim"]: c for c in claims}


CUDA_GELU = "gelu: a hand-written CUDA C++ kernel is about as fast as torch."
NAIVE_GELU = "gelu: the fused built-in (torch) is several times faster than the op written as separate ops."


def test_every_claim_and_question_holds_on_h200_like_figures_except_the_plain_cuda_kernel():
    claims = evaluate_claims(h200_like())
    not_held = [c["claim"] for c in claims if c["held"] is False]
    assert not_held == [CUDA_GELU]  # 1.98x F.gelu's time
    # the softmax cuda kernel and attention have no timing in these results: n/a, not held
    assert [c["claim"] for c in claims if c["held"] is None] == [
        "attention: the fused built-in (sdpa) is several times faster than the op written as separate ops.",
        "attention: a hand-written Triton kernel is about as fast as sdpa.",
        "softmax: a hand-written CUDA C++ kernel is about as fast as torch.",
    ]
    answers = answer_questions(h200_like())
    assert [a["question"] for a in answers] == [q.text for q in questions()]
    assert all(a["held"] is True for a in answers)
    assert "```cuda" in answers[3]["answer"] and "ld.global.v4.b32" in answers[3]["answer"]
    assert answers[4]["question"].startswith("Why does the softmax kernel give one whole row")
    assert answers[4]["value"] == pytest.approx(3950 / 300)  # element per thread against row per program


def test_the_element_per_thread_kernel_is_not_the_hand_written_triton_kernel():
    """The generic "hand-written Triton kernel" claim reads impl "triton" only: a slow triton-elementwise leaves it
    held, and only question 5 reads the element-per-thread kernel."""
    results = h200_like()
    for slow in (300.0, 10.0):
        results["softmax"]["bench"] = softmax_rows(elementwise_gbps=slow)
        claims = evaluate_claims(results)
        triton = by_text(claims)["softmax: a hand-written Triton kernel is about as fast as torch."]
        assert triton["held"] is True and triton["value"] == pytest.approx(4000 / 3950)
        assert not any("elementwise" in c["claim"] or "elementwise" in c["figure"] for c in claims)
    results["softmax"]["bench"] = [r for r in softmax_rows() if r["impl"] != "triton"]
    assert answer_questions(results)[4]["held"] is None  # no row-per-program timing: n/a, not a wrong figure


def test_every_op_gets_the_generic_claims():
    """Every memory-bound op with naive, compile, triton and baseline impls gets the three claims made for every op."""
    texts = [c["claim"] for c in evaluate_claims({})]
    needs = lambda op: {"naive", "compile", "triton", op.defaults.baseline}  # noqa: E731
    generic = [op.name for op in all_ops() if op.bound == "memory" and needs(op) <= set(op.impls)]
    assert generic, "no op to make the generic claims of"
    for op in generic:
        assert any(t.startswith(f"{op}: the fused built-in") for t in texts)
        assert any(t.startswith(f"{op}: torch.compile fuses") for t in texts)
        assert any(t.startswith(f"{op}: a hand-written Triton kernel") for t in texts)


def test_figures_are_read_from_the_results_not_written_in():
    results = h200_like()
    naive = by_text(evaluate_claims(results))[NAIVE_GELU]
    assert naive["value"] == pytest.approx(5.49 / 0.509)
    assert "10.8×" in naive["figure"]
    slower = copy.deepcopy(results)
    slower["gelu"]["bench"] = gelu_rows(0.9, 0.509, 0.589, 0.508, 1.009)
    naive = by_text(evaluate_claims(slower))[naive["claim"]]
    assert naive["value"] == pytest.approx(0.9 / 0.509)
    assert naive["held"] is False
    answer = answer_questions(slower)[1]
    assert "1.77×" in answer["answer"] and answer["held"] is False


def test_a_gpu_claim_is_not_applicable_on_the_cpu():
    results = h200_like()
    for case in results["pitfalls"]["cases"]:
        case["synchronous_device"] = True
    sync = by_text(evaluate_claims(results))[
        "Timing a GPU kernel without synchronize measures only its launch and under-reports its time."
    ]
    assert sync["held"] is None and "CPU" in sync["figure"]


def test_missing_sections_are_not_measured_and_nothing_raises():
    claims = evaluate_claims({})
    assert all(c["held"] is None and c["figure"].startswith("not measured") for c in claims)
    assert all(c["claim"] and not c["claim"].startswith("(") for c in claims)  # the claim text still reads
    answers = answer_questions({"gelu": {"bench": []}})
    assert all(a["held"] is None and "not measured" in a["answer"] for a in answers)


def test_failed_rows_are_skipped():
    results = h200_like()
    results["gelu"]["bench"][3] = {**results["gelu"]["bench"][3], "error": "Triton compile error", "median_ms": None}
    triton = by_text(evaluate_claims(results))["gelu: a hand-written Triton kernel is about as fast as torch."]
    assert triton["held"] is None and "no gelu triton and torch timings" in triton["figure"]


def test_verdict_marks():
    assert verdict(True) == "✓ held"
    assert verdict(False) == "✗ not held"
    assert verdict(None) == "– n/a"


def test_a_verdict_resting_on_a_rate_past_its_ceiling_says_so():
    """F.gelu at 615% of the copy ceiling would hold 'near the copy bandwidth' on a figure no memory allows: the
    figure says the rate is past its ceiling and the verdict carries ABOVE_MARK."""
    from fuselab.bench.results import ABOVE_MARK

    results = h200_like()
    rows = results["gelu"]["bench"]
    torch_row = next(r for r in rows if r["impl"] == "torch")
    torch_row["pct_copy"] = 615.0
    claim = next(c for c in evaluate_claims(results) if "near the copy bandwidth" in c["claim"])
    assert "615% of copy" in claim["figure"] and "rests on a rate past its ceiling" in claim["figure"]
    assert claim["past"] and verdict(claim["held"], past=claim["past"]).endswith(ABOVE_MARK)
    quiet = next(c for c in evaluate_claims(h200_like()) if "near the copy bandwidth" in c["claim"])
    assert not quiet["past"] and "past its ceiling" not in quiet["figure"]
