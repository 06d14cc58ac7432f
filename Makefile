# fuselab: the two commands of the quick start, and a few more.
#   make report   set up .venv and run the report (on the CPU when there is no GPU) into report/
#   make test     set up .venv and run the tests (GPU tests are skipped without a GPU)
#   make run ARGS="device"     any fuselab command, from the venv (or: source .venv/bin/activate; fuselab ...)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned to the CPU build that lies on this machine's disk; an unpinned torch would pull a CUDA build
TORCH ?= torch==2.13.0
TRITON ?= triton==3.6.0

ARGS ?=

.PHONY: setup report run test lint gpu-test gpu-gate clean

$(BIN)/fuselab: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" "$(TRITON)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/fuselab

report: setup
	$(BIN)/fuselab report --out report $(ARGS)

# any command: make run ARGS="bench gelu --shape 2^20"
run: setup
	$(BIN)/fuselab $(ARGS)

# the CPU suite over up to 4 pytest-xdist workers (2 on CI's 2 cores: about 9 min instead of 13-17)
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

test: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/pytest -q -n $(TEST_JOBS)

gpu-test: setup
	$(BIN)/pytest -q -m gpu

# before every landing of code the GPU runs: the whole GPU suite, checks, compiles, a model, benches (on a GPU)
gpu-gate: setup
	PYTHON=$(BIN)/python bash scripts/gpu_gate.sh $(ARGS)

clean:
	rm -rf $(VENV) report .pytest_cache
