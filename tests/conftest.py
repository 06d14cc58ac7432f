"""Test setup: GPU tests are marked `gpu`; without a CUDA GPU they are skipped with a reason, never passed."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import fuselab  # noqa: F401  (sets TRITON_INTERPRET=1 when there is no GPU, before any kernel is defined)

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The test marked `first` first, the rest in their order: pytest-xdist hands out tests in consecutive chunks
    in the order collected, so the suite's longest test (the quick report), collected last, would run alone after
    the others and hold the GPU gate's suite past its budget (docs/gate.md). One test only: several would share the
    first worker's chunk. Without a GPU, tests marked `gpu` are skipped."""
    items.sort(key=lambda item: "first" not in item.keywords)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run `pytest -m gpu` on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """A test's cached GPU memory goes back to the device when it ends: pytest-xdist workers and the GPU gate's jobs
    share one GPU, and blocks a finished test left in PyTorch's cache would starve the gate's jobs past 2^31 elements
    (docs/results-h200.md, the gate's runs)."""
    if HAS_CUDA and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture
def device() -> str:
    """The device tests run on: the GPU when there is one, else the CPU."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def whole_gpu_memory():
    """For a test that needs most of the GPU's memory: under the GPU gate, it waits for the gate's other such work
    (fuselab.gate.jobs.whole_gpu_memory); elsewhere it does nothing."""
    from fuselab.gate.jobs import whole_gpu_memory

    with whole_gpu_memory():
        yield


@pytest.fixture
def busy_cpu():
    """For the test's body, processes running matmuls (as many as torch's threads, at least two), each spinning
    before the body starts (importing torch on a loaded machine can take seconds): a busy CPU, for the timer's
    contention checks."""
    spin = "import torch\na = torch.randn(600, 600)\na @ a\nprint('spinning', flush=True)\nwhile True: a @ a"
    hogs = [
        subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
        for _ in range(max(2, torch.get_num_threads()))
    ]
    try:
        for hog in hogs:
            assert hog.stdout is not None and hog.stdout.readline().strip() == "spinning"
        time.sleep(0.2)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache folder with a (fake) ceiling for this CPU, so no test spends time measuring it."""
    return fake_ceiling_cache(tmp_path / "cache")


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`cache`, for a module-scoped fixture (one run whose results a module's tests share)."""
    return fake_ceiling_cache(tmp_path_factory.mktemp("module") / "cache")


def fake_ceiling_cache(folder: Path) -> Path:
    """`folder`, made a cache holding a fake ceiling for this CPU (copy 10 GB/s, no matmul rates)."""
    from fuselab.bench import ceilings

    old = os.environ.get("FUSELAB_CACHE")
    os.environ["FUSELAB_CACHE"] = str(folder)
    try:
        path = ceilings.cache_dir() / f"{ceilings.cache_key('cpu')}.json"
    finally:
        os.environ.pop("FUSELAB_CACHE") if old is None else os.environ.__setitem__("FUSELAB_CACHE", old)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"copy_gbps": 10.0, "matmul_tflops": {}, "quick": False}))
    return folder
