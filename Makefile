# Every target sets up what it needs: a fresh clone only needs `make demo` or `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SWEEP_DIR ?= sweeps/demo
FIG_DIR ?= figures
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: venv demo test test-fast lint figures bench gpu-check mutants clean slurm-up slurm-down proxy-cpu proxy-paper proxy-confound proxy-confound-cpu proxy-paper-interventions

venv: $(STAMP)

# torch is pinned and installed first from the local CPU wheel so pip never pulls a CUDA build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,tracking]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sweep launch grids/demo.yaml --sweep-dir $(SWEEP_DIR) --executor local
	$(BIN)/sweep status $(SWEEP_DIR)
	$(BIN)/sweep analyze $(SWEEP_DIR) --plot scaling --out $(SWEEP_DIR)/figures
	$(BIN)/sweep report $(SWEEP_DIR) --out $(SWEEP_DIR)/report
	@echo "demo figure: $(SWEEP_DIR)/figures/scaling.png"
	@echo "demo report (open in a browser): file://$(abspath $(SWEEP_DIR))/report/index.html"

# The proxy study end to end: paired FP32/MX runs, every intervention arm branched before the
# detected onset of each unstable MX run, then the paired and intervention figures/tables.
PROXY_GRID ?= grids/proxy_cpu.yaml
PROXY_DIR ?= sweeps/$(basename $(notdir $(PROXY_GRID)))
PROXY_BEFORE ?= 20
PROXY_EXECUTOR ?= local
PROXY_ARMS ?= all
proxy-cpu: $(STAMP)
	$(BIN)/sweep launch $(PROXY_GRID) --sweep-dir $(PROXY_DIR) --executor $(PROXY_EXECUTOR)
	$(BIN)/sweep intervene --sweep-dir $(PROXY_DIR) --unstable --config mx_e4m3 --at onset \
		--before $(PROXY_BEFORE) --arms $(PROXY_ARMS) --executor $(PROXY_EXECUTOR)
	$(BIN)/sweep status $(PROXY_DIR)
	@if grep -qs '"branch": {' $(PROXY_DIR)/runs/*/spec.json; then \
		branches="--plot interventions --table interventions"; \
	else echo "no unstable MX run: nothing was branched"; fi; \
	$(BIN)/sweep analyze $(PROXY_DIR) --plot paired --table paired $$branches \
		--out $(PROXY_DIR)/figures
	@echo "proxy figures and tables: $(PROXY_DIR)/figures/index.md"

# On a GPU machine: the paper's regime (grids/proxy_paper.yaml), branching 590 steps early.
proxy-paper:
	$(MAKE) proxy-cpu PROXY_GRID=grids/proxy_paper.yaml PROXY_BEFORE=590 PROXY_ARMS=paper

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

# One-line mutants of the code (tests/mutants/catalog.py), each run against the tests that
# concern it in a copy of the repository: every one must make them fail.
mutants: $(STAMP)
	$(BIN)/python tests/mutants/run.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

figures: $(STAMP)
	$(BIN)/sweep report --paper --out $(FIG_DIR)/paper
	@if [ -d $(SWEEP_DIR)/runs ]; then $(BIN)/sweep report $(SWEEP_DIR) --out $(FIG_DIR)/demo; \
	else echo "no demo sweep at $(SWEEP_DIR): run 'make demo' first for its figures"; fi
	$(BIN)/python -m analysis.index $(FIG_DIR)

bench: $(STAMP)
	$(BIN)/python -m bench.run_all

# On a machine with one GPU (< 8 min on an H100/H200): see bench/gpu_check.py and README.
# `make gpu-check GPU_CHECK_ARGS="--device cpu --quick"` runs it small on CPU.
GPU_CHECK_ARGS ?=
gpu-check: $(STAMP)
	$(BIN)/python -m bench.gpu_check --out . $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) sweeps figures .pytest_cache

# The LN-bias confound study: the same seeds in FP32, FP32 with a frozen LN bias, MX under
# the paper profile and MX with a trained LN bias; which diverge and when. GPU-sized grid
# (grids/proxy_confound.yaml); `make proxy-confound-cpu` runs the CPU-sized one.
CONFOUND_GRID ?= grids/proxy_confound.yaml
CONFOUND_DIR ?= sweeps/$(basename $(notdir $(CONFOUND_GRID)))
proxy-confound: $(STAMP)
	$(BIN)/sweep launch $(CONFOUND_GRID) --sweep-dir $(CONFOUND_DIR) --executor $(PROXY_EXECUTOR)
	$(BIN)/sweep status $(CONFOUND_DIR) --no-runs
	$(BIN)/sweep analyze $(CONFOUND_DIR) --table confound --plot confound --out $(CONFOUND_DIR)/figures
	@echo "confound table: $(CONFOUND_DIR)/figures/confound.md"

proxy-confound-cpu:
	$(MAKE) proxy-confound CONFOUND_GRID=grids/proxy_confound_cpu.yaml

# The paper's in-situ interventions (GPU): its canonical run, branched at MX steps 4500 and
# 4700 with the paper's arms; then its from-scratch LN-fix runs.
proxy-paper-interventions: $(STAMP)
	$(BIN)/sweep launch grids/proxy_paper_canonical.yaml --sweep-dir sweeps/proxy_paper_canonical
	$(BIN)/sweep intervene $$(ls sweeps/proxy_paper_canonical/runs) \
		--sweep-dir sweeps/proxy_paper_canonical --at 4700 --before 0 --before 200 --arms paper
	$(BIN)/sweep launch grids/proxy_paper_ln_fix.yaml --sweep-dir sweeps/proxy_paper_ln_fix
	$(BIN)/sweep analyze sweeps/proxy_paper_canonical --plot interventions --table interventions \
		--out sweeps/proxy_paper_canonical/figures
