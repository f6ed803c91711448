# Every target sets up what it needs: a fresh clone only needs `make demo` or `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SWEEP_DIR ?= sweeps/demo
FIG_DIR ?= figures
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: venv demo test test-fast lint figures bench clean slurm-up slurm-down

venv: $(STAMP)

# torch is pinned and installed first from the local CPU wheel so pip never pulls a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sweep launch grids/demo.yaml --sweep-dir $(SWEEP_DIR) --executor local
	$(BIN)/sweep status $(SWEEP_DIR)
	$(BIN)/sweep analyze $(SWEEP_DIR) --plot scaling --out $(SWEEP_DIR)/figures
	@echo "demo figure: $(SWEEP_DIR)/figures/scaling.png"

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

figures: $(STAMP)
	$(BIN)/sweep analyze --paper --plot all --table all --out $(FIG_DIR)/paper
	@if [ -d $(SWEEP_DIR)/runs ]; then $(BIN)/sweep analyze $(SWEEP_DIR) --plot all --table all --out $(FIG_DIR)/demo; \
	else echo "no demo sweep at $(SWEEP_DIR): run 'make demo' first for its figures"; fi
	$(BIN)/python -m analysis.index $(FIG_DIR)

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) sweeps figures .pytest_cache
