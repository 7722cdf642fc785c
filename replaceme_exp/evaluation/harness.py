"""lm-eval-harness on the in-memory model (no save and reload), with suites from the ``eval``
config group and the project's own offline tasks (local JSONL shipped in ``offline_tasks/``).

Each suite declares the metric of each task (``eval.harness.metrics``, ``task: metric``): the
task's ``score_<task>`` column and, for tasks whose metric is not a perplexity, its share of
``avg_acc``."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from replaceme_exp.config import schema
from replaceme_exp.config.protocol import left_to_protocol, protocol_rule
from replaceme_exp.config.schema import HarnessConfig
from replaceme_exp.data.files import check_readable
from replaceme_exp.data.sources import pack_paragraphs, pydoc_text
from replaceme_exp.errors import ConfigError
from replaceme_exp.evaluation.item_floors import chance, cluster_codes, item_of, majority, score_range
from replaceme_exp.evaluation.scored_positions import ScoredPositionsMixin
from replaceme_exp.intervals import mean_interval
from replaceme_exp.progress import progress_counter, resolved_mode
from replaceme_exp.row_format import PERPLEXITY_METRICS, decode_items, encode_items, metric_column, stderr_column

log = logging.getLogger(__name__)

OFFLINE_TASKS = Path(__file__).parent / "offline_tasks"
HUB_TASKS = Path(__file__).parent / "hub_tasks"  # hub-data tasks (eval=llama2_table), next to the defaults

# Metrics recorded as ``<metric>_<task>`` (with ``<metric>_stderr_<task>``) whether declared or not.
ACCURACY_METRICS = ("acc", "acc_norm", "exact_match")


def materialize_offline_tasks(target: Path, n_ppl_docs: int = 12) -> Path:
    """Write the offline task YAMLs (with absolute data paths) and their data into ``target``;
    the rolling-perplexity task reads held-out pydoc paragraphs (disjoint from calibration)."""
    target.mkdir(parents=True, exist_ok=True)
    for jsonl in OFFLINE_TASKS.glob("*.jsonl"):
        shutil.copy(jsonl, target / jsonl.name)
    documents = pack_paragraphs(pydoc_text("heldout"), 1200)[:n_ppl_docs]
    (target / "pydoc_ppl.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in documents))
    for yaml in OFFLINE_TASKS.glob("*.yaml"):
        (target / yaml.name).write_text(yaml.read_text().replace("__DIR__", str(target)))
    return target


def check_suite(suite: schema.EvalConfig) -> None:
    """The eval suite's own keys, before anything loads: one metric per lm-eval task, clusters only of its
    tasks, a held-out text file that can be opened."""
    harness = suite.harness
    if harness is not None and set(harness.metrics) != set(harness.tasks):
        metrics, tasks = harness.metrics, list(harness.tasks)
        raise ConfigError(
            "eval.harness.metrics",
            metrics,
            f"declare one metric per task of eval.harness.tasks {tasks} "
            f"(missing {sorted(set(tasks) - set(metrics))}, extra {sorted(set(metrics) - set(tasks))})",
        )
    if harness is not None and set(harness.clusters) - set(harness.tasks):
        clusters, tasks = harness.clusters, list(harness.tasks)
        extra = sorted(set(clusters) - set(tasks))
        reason = f"names tasks {extra} that eval.harness.tasks {tasks} lacks"
        raise ConfigError("eval.harness.clusters", clusters, reason)
    if suite.text == "text_file":
        check_readable("eval.path", suite.path)


def declared_metrics(cfg: HarnessConfig) -> dict[str, str]:
    """``eval.harness.metrics`` as a plain dict, checked to name exactly the suite's tasks."""
    metrics = dict(cfg.metrics or {})
    tasks = list(cfg.tasks)
    if set(metrics) != set(tasks):
        raise ConfigError(
            "eval.harness.metrics",
            metrics,
            f"declare one metric per task of eval.harness.tasks {tasks} "
            f"(missing {sorted(set(tasks) - set(metrics))}, extra {sorted(set(metrics) - set(tasks))})",
        )
    return {task: str(metric) for task, metric in metrics.items()}


def accuracy_columns(cfg: HarnessConfig) -> list[str]:
    """The columns ``avg_acc`` averages, in the suite's task order (e.g. ``acc_norm_piqa``)."""
    return [metric_column(t, m) for t, m in declared_metrics(cfg).items() if m not in PERPLEXITY_METRICS]


def _number(value: Any) -> float | None:
    """lm-eval writes ``"N/A"`` where it has no value (e.g. stderr with ``bootstrap_iters=0``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def collect_scores(
    results: dict[str, dict[str, Any]], metrics: dict[str, str], ppl_names: dict[str, str] | None = None
) -> dict[str, float]:
    """Row columns from lm-eval's ``out["results"]`` (``{task: {"acc,none": .., "acc_stderr,none":
    .., "alias": ..}}``): ``<metric>_<task>`` and ``<metric>_stderr_<task>`` for the accuracy
    metrics and any declared metric, ``ppl_<name>`` / ``ppl_stderr_<name>`` for perplexities,
    ``score_<task>`` / ``score_stderr_<task>`` = the declared metric of each task in ``metrics``,
    and ``avg_acc`` = mean of ``score_<task>`` over the declared tasks whose metric is not a
    perplexity (``avg_acc_stderr``: ``sqrt(sum se_i^2) / k`` when every task has its standard
    error); ``avg_acc_all`` = the same mean with the ``acc`` of each perplexity task that reports
    one (Lambada) added as a task. Values that are not numbers are skipped; of several filters the
    ``none`` one (else the first reported) wins. Raises if a declared metric is missing."""
    ppl_names = ppl_names or {}
    scores: dict[str, float] = {}
    wanted = set(ACCURACY_METRICS) | set(PERPLEXITY_METRICS) | set(metrics.values())
    for task, reported in results.items():
        # {metric: {filter: [value, stderr]}} from keys "<metric>,<filter>", "<metric>_stderr,<filter>"
        by_metric: dict[str, dict[str, list[float | None]]] = {}
        for key, raw in reported.items():
            name, _, filter_key = key.partition(",")
            is_stderr = name.endswith("_stderr")
            metric = name[: -len("_stderr")] if is_stderr else name
            if metric in wanted and filter_key:
                by_metric.setdefault(metric, {}).setdefault(filter_key, [None, None])[int(is_stderr)] = _number(raw)
        for metric, filters in by_metric.items():
            ordered = [filters["none"]] if "none" in filters else []
            ordered += [pair for f, pair in filters.items() if f != "none"]
            value, stderr = next((pair for pair in ordered if pair[0] is not None), (None, None))
            if value is None:
                continue
            columns = [metric_column(task, metric, ppl_names)]
            stderr_columns = [stderr_column(task, metric, ppl_names)]
            if metrics.get(task) == metric:
                columns.append(f"score_{task}")
                stderr_columns.append(f"score_stderr_{task}")
            scores.update(dict.fromkeys(columns, value))
            if stderr is not None:
                scores.update(dict.fromkeys(stderr_columns, stderr))
    missing = {t: m for t, m in metrics.items() if f"score_{t}" not in scores}
    if missing:
        raise RuntimeError(f"lm-eval returned no {missing} (task: metric); it returned {sorted(scores)}")
    accuracy = [t for t, m in metrics.items() if m not in PERPLEXITY_METRICS]
    if accuracy:
        scores["avg_acc"] = sum(scores[f"score_{t}"] for t in accuracy) / len(accuracy)
        errors = [scores.get(f"score_stderr_{t}") for t in accuracy]
        if all(e is not None for e in errors):  # the tasks' items are independent of each other
            scores["avg_acc_stderr"] = math.sqrt(sum(e * e for e in errors)) / len(accuracy)
    # and with the accuracy of the perplexity tasks that report one (Lambada): the paper's
    # "average accuracy over all benchmarks" (its significance study; the 25% cells of its
    # higher-compression table)
    also = [scores[f"acc_{t}"] for t, m in metrics.items() if m in PERPLEXITY_METRICS and f"acc_{t}" in scores]
    if accuracy and also:
        scores["avg_acc_all"] = (sum(scores[f"score_{t}"] for t in accuracy) + sum(also)) / (len(accuracy) + len(also))
    return scores


def _leaf_tasks(task: str, subtasks: dict[str, list[str]]) -> list[str]:
    """The tasks lm-eval scored item by item under ``task`` (itself, or a group's subtasks, recursively)."""
    children = subtasks.get(task)
    if not children:
        return [task]
    return [leaf for child in children for leaf in _leaf_tasks(child, subtasks)]


def _kept_samples(samples: list[dict]) -> list[dict]:
    """The samples of one filter (``none`` when lm-eval ran it, else the first), by ``doc_id``."""
    filters = [s.get("filter") for s in samples]
    chosen = "none" if "none" in filters else (filters[0] if filters else None)
    return sorted((s for s in samples if s.get("filter") == chosen), key=lambda s: s["doc_id"])


def _sample_values(samples: list[dict], metric: str) -> tuple[list[float], list[str]]:
    """The ``metric`` of each item, by ``doc_id``, and the items' document hashes (:func:`_kept_samples`)."""
    kept = _kept_samples(samples)
    return [float(s[metric]) for s in kept], [str(s.get("doc_hash")) for s in kept]


def floor_columns(task: str, samples: list[dict], values: list[float], cluster: str | None) -> dict[str, Any]:
    """What ``task``'s items can show (:mod:`~replaceme_exp.evaluation.item_floors`): ``floor_chance_<task>``,
    ``floor_majority_<task>``, ``item_clusters_<task>`` (each item's cluster when the suite declares one,
    else None), the score's 95% interval over its items (by cluster where declared:
    ``score_<task>_ci_low`` / ``_ci_high``) and ``score_range_<task>`` (``floor``, ``ceiling`` or None)."""
    items = [item_of(s) for s in samples] if all("target" in s for s in samples) else None
    codes = cluster_codes(items, cluster) if cluster and items else None
    floors = {"chance": chance(items), "majority": majority(items)} if items else {"chance": None, "majority": None}
    low, high = mean_interval([np.asarray(values)], clusters=[codes]) if values else (None, None)
    known = [f for f in floors.values() if f is not None]
    score = sum(values) / len(values) if values else None
    return {
        f"floor_chance_{task}": floors["chance"],
        f"floor_majority_{task}": floors["majority"],
        f"item_clusters_{task}": codes,
        f"score_{task}_ci_low": low,
        f"score_{task}_ci_high": high,
        f"score_range_{task}": score_range(score, low, max(known) if known else None),
    }


def collect_items(
    out: dict[str, Any], metrics: dict[str, str], clusters: dict[str, str] | None = None
) -> dict[str, Any]:
    """Item-level columns from lm-eval's output with ``log_samples``: for each declared task whose
    metric is not a perplexity, ``score_items_<task>`` (the declared metric of each item, in document
    order: :func:`encode_items`), ``items_hash_<task>`` (the items' documents: rows with the same hash
    were scored on the same items, in the same order), ``n_items_<task>`` and its floors and interval
    (:func:`floor_columns`; ``clusters``: task -> what its items share); for a perplexity task
    ``n_items_<task>`` (its documents). With every accuracy task itemised: ``avg_acc_items`` and
    ``avg_acc_ci_low`` / ``avg_acc_ci_high`` (95% bootstrap over each task's items, by cluster where a
    task declares them)."""
    samples, subtasks = out.get("samples") or {}, out.get("group_subtasks") or {}
    counts = out.get("n-samples") or {}
    clusters = clusters or {}
    columns: dict[str, Any] = {}
    itemised, codes = [], []
    for task, metric in metrics.items():
        leaves = _leaf_tasks(task, subtasks)
        if metric in PERPLEXITY_METRICS:
            documents = [int((counts.get(leaf) or {}).get("effective", 0)) for leaf in leaves]
            columns[f"n_items_{task}"] = sum(documents) if all(documents) else None
            continue
        if not all(leaf in samples for leaf in leaves):
            continue
        values, hashes, kept = [], [], []
        for leaf in leaves:
            found, digests = _sample_values(samples[leaf], metric)
            values += found
            hashes += [f"{leaf}:{d}" for d in digests]
            kept += _kept_samples(samples[leaf])
        columns[f"score_items_{task}"] = encode_items(values)
        columns[f"items_hash_{task}"] = hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]
        columns[f"n_items_{task}"] = len(values)
        columns.update(floor_columns(task, kept, values, clusters.get(task)))
        itemised.append(decode_items(columns[f"score_items_{task}"]))
        codes.append(columns[f"item_clusters_{task}"])
    accuracy = [t for t, m in metrics.items() if m not in PERPLEXITY_METRICS]
    if accuracy and len(itemised) == len(accuracy):
        columns["avg_acc_items"] = sum(len(v) for v in itemised)
        columns["avg_acc_ci_low"], columns["avg_acc_ci_high"] = mean_interval(itemised, clusters=codes)
    return columns


def lm_eval_version() -> str | None:
    try:
        return version("lm_eval")
    except PackageNotFoundError:
        return None


# What each protocol scores with: lm-eval's batch size, and the lm-eval version its numbers were made
# with (official: eval_model's simple_evaluate at its default batch size 1, lm-eval pinned to 0.4.8 by
# setup.py; paper: this project's batch size, no version named).
PROTOCOL_BATCH_SIZE = {"paper": 8, "official": 1}
PROTOCOL_LM_EVAL = {"official": "0.4.8"}


@protocol_rule("eval.harness.batch_size")
def batch_size_of_the_protocol(config: schema.JobConfig) -> dict:
    """``eval.harness.batch_size`` left to the protocol: 8 (paper), 1 (official). Scores move in the third
    decimal with the batch size (padding and batched kernels), the size of the paper's ±0.08 study."""
    if not left_to_protocol(config, "eval.harness.batch_size"):
        return {}
    return {"eval.harness.batch_size": PROTOCOL_BATCH_SIZE[config.protocol]}


def protocol_version_columns(protocol: str) -> dict[str, Any]:
    """``lm_eval_version_protocol``: the lm-eval version ``protocol``'s scores were made with (None: it
    names none); ``lm_eval_off_protocol``: the installed one differs from it (tables mark such rows)."""
    expected, installed = PROTOCOL_LM_EVAL.get(protocol), lm_eval_version()
    off = expected is not None and installed != expected
    return {"lm_eval_version_protocol": expected, "lm_eval_off_protocol": off}


def bootstrap_iters(cfg: HarnessConfig) -> int:
    return int(cfg.bootstrap_iters)


@functools.cache
def offline_tasks_digest() -> str:
    """The project's offline task files (their YAMLs and items) by content: what a local suite's scores
    depend on beyond its settings (a baseline is recomputed when an item changes)."""
    digest = hashlib.sha256()
    for path in sorted([*OFFLINE_TASKS.glob("*.yaml"), *OFFLINE_TASKS.glob("*.jsonl")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _bootstrap_in_process():
    """lm-eval's bootstrap standard errors (perplexity metrics) in this process: its default forks a
    pool from a process whose torch and tracking threads may hold locks, and a forked worker then
    waits on one for ever. The same resamples (seeded per chunk) either way."""
    before = os.environ.get("DISABLE_MULTIPROC")
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DISABLE_MULTIPROC", None)
        else:
            os.environ["DISABLE_MULTIPROC"] = before


def harness_settings(cfg: HarnessConfig) -> dict[str, Any]:
    """Every setting of the suite ``cfg`` (``eval.harness``) that moves a score, as JSON-able row
    columns. ``eval_max_length`` is the configured value (``null``: lm-eval takes the model's);
    the task versions are only known after the run (``eval_task_versions`` of :func:`run_harness`)."""
    limit = cfg.limit
    return {
        "eval_batch_size": cfg.batch_size,
        "eval_add_bos_token": bool(cfg.add_bos_token),
        "eval_max_length": None if cfg.max_length is None else int(cfg.max_length),
        "eval_fewshot": {task: int(n) for task, n in cfg.tasks.items()},
        "eval_fewshot_seed": int(cfg.fewshot_seed),
        "eval_limit": limit,
        "eval_bootstrap_iters": bootstrap_iters(cfg),
        "eval_metrics": declared_metrics(cfg),
        "lm_eval_version": lm_eval_version(),
        "eval_item_clusters": dict(cfg.clusters or {}),
        "eval_tasks_digest": offline_tasks_digest() if cfg.local_tasks else None,
    }


def _json_version(value: Any) -> Any:
    return value if value is None or isinstance(value, (int, float, str)) else str(value)


class _TickingCacheHook:
    """Stands in for lm-eval's cache hook while requests run: lm-eval hands it each request's
    result as soon as it has it (``add_partial``), so each one of ``kind`` counts one request done."""

    def __init__(self, hook, kind: str, counter):
        self.hook, self.kind, self.counter = hook, kind, counter

    def add_partial(self, attr: str, req, res) -> None:
        if attr == self.kind:
            self.counter.update(1)
        self.hook.add_partial(attr, req, res)


@functools.cache
def progress_lm_class() -> type:
    """lm-eval's HFLM with its request loops reporting through :mod:`replaceme_exp.progress`: on a
    terminal (``progress.mode`` bar) lm-eval's own tqdm bars as before; otherwise its bars are
    turned off and ``lm-eval loglikelihood: 40/224 requests (18%), ...`` lines are logged
    (``loglikelihood_rolling`` counts windows of ``max_length`` tokens). Scores are unchanged.
    Its LM head projects only the positions lm-eval scores (:mod:`.scored_positions`)."""
    from lm_eval.models.huggingface import HFLM

    class ProgressHFLM(ScoredPositionsMixin, HFLM):
        _window_counter = None
        _quiet = False

        @contextlib.contextmanager
        def _reporting(self, kind: str, total: int, unit: str, tick_kind: str | None):
            with progress_counter(total, f"lm-eval {kind}", unit=unit) as counter:
                hook, self._quiet = self.cache_hook, True
                if tick_kind is not None:
                    self.cache_hook = _TickingCacheHook(hook, tick_kind, counter)
                else:
                    self._window_counter = counter
                try:
                    yield
                finally:
                    self.cache_hook, self._quiet, self._window_counter = hook, False, None

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            if resolved_mode() == "bar":
                return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
            with self._reporting("loglikelihood", len(requests), "request", "loglikelihood"):
                return super().loglikelihood(requests, disable_tqdm=True)

        def generate_until(self, requests, disable_tqdm: bool = False):
            if resolved_mode() == "bar":
                return super().generate_until(requests, disable_tqdm=disable_tqdm)
            with self._reporting("generate_until", len(requests), "request", "generate_until"):
                return super().generate_until(requests, disable_tqdm=True)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            if resolved_mode() == "bar":
                return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)
            # lm-eval cuts each document into windows of max_length predicted tokens (context 1).
            windows = sum(-(-len(self.tok_encode(req.args[0])) // self.max_length) for req in requests)
            with self._reporting("loglikelihood_rolling", windows, "window", None):
                return super().loglikelihood_rolling(requests, disable_tqdm=True)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            # loglikelihood_rolling calls this per batch of windows with its bar on.
            out = super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm or self._quiet, **kwargs)
            if self._window_counter is not None:
                self._window_counter.update(len(requests))
            return out

    return ProgressHFLM


class _DropMessages(logging.Filter):
    """Drops the records whose message starts with one of ``prefixes``."""

    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


# HFLM warns on every in-memory model (the harness's design: no save and reload), with advice for
# accelerate launches that does not apply; only these two messages, only while the wrapper is built.
_IN_MEMORY_MODEL_WARNINGS = _DropMessages(
    "`pretrained` model kwarg is not of type `str`",
    "Passed an already-initialized model through `pretrained`",
)


@contextlib.contextmanager
def _quiet_lm_eval():
    """lm-eval at WARNING while the harness runs (its INFO lines repeat per run what the job log
    says; ``LMEVAL_LOG_LEVEL`` still wins), and, when progress is not a bar, without the datasets
    library's progress bars (they write carriage-return bars into log files)."""
    import datasets

    logger = logging.getLogger("lm_eval")
    level = logger.level
    if not os.environ.get("LMEVAL_LOG_LEVEL"):
        logger.setLevel(logging.WARNING)
    bars = datasets.is_progress_bar_enabled()
    if bars and resolved_mode() != "bar":
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def _declares_fewshot(manager, name: str) -> bool:
    """Whether lm-eval's task ``name`` may declare its own ``num_fewshot`` (unknown: yes)."""
    entry = manager.task_index.get(name)
    if entry is None or entry.cfg is None or getattr(entry.kind, "name", "") != "TASK":
        return True
    return entry.cfg.get("num_fewshot") is not None


def run_harness(model, tokenizer, cfg: HarnessConfig, work_dir: Path) -> dict[str, Any]:
    """Scores of ``model`` on the suite ``cfg`` (``eval.harness``), see :func:`collect_scores`
    (each metric with its standard error where lm-eval gives one: closed form for accuracies,
    ``cfg.bootstrap_iters`` resamples for ``perplexity``), plus ``eval_task_versions`` ({task:
    version} of every task and group lm-eval ran) and ``eval_max_length_used`` (the context
    length lm-eval used: ``cfg.max_length`` or the model's). All values are JSON-able."""
    from lm_eval.tasks import TaskManager

    metrics = declared_metrics(cfg)
    include = str(materialize_offline_tasks(Path(work_dir) / "lm_eval_tasks")) if cfg.local_tasks else str(HUB_TASKS)
    manager = TaskManager(include_path=include, include_defaults=not cfg.local_tasks)
    with _quiet_lm_eval(), _bootstrap_in_process():
        return _run_suite(model, tokenizer, cfg, manager, metrics)


def _run_suite(model, tokenizer, cfg: HarnessConfig, manager, metrics: dict[str, str]) -> dict[str, Any]:
    from lm_eval import simple_evaluate

    hf_logger = logging.getLogger("lm_eval.models.huggingface")
    hf_logger.addFilter(_IN_MEMORY_MODEL_WARNINGS)
    try:
        lm = progress_lm_class()(
            pretrained=model,
            tokenizer=tokenizer,
            batch_size=cfg.batch_size,
            add_bos_token=cfg.add_bos_token,
            max_length=cfg.max_length,
        )
    finally:
        hf_logger.removeFilter(_IN_MEMORY_MODEL_WARNINGS)
    by_fewshot: dict[int, list[str]] = {}
    for task, fewshot in cfg.tasks.items():
        by_fewshot.setdefault(int(fewshot), []).append(task)
    ppl_names = dict(cfg.ppl_names or {})
    results: dict[str, dict] = {}
    versions: dict[str, Any] = {}
    logged: dict[str, Any] = {"samples": {}, "group_subtasks": {}, "n-samples": {}}
    for fewshot, tasks in by_fewshot.items():
        # Zero-shot tasks that declare no num_fewshot of their own are zero-shot without being told
        # (lm-eval warns "Overwriting default num_fewshot ... from None to 0" when told).
        zero_by_default = fewshot == 0 and not any(_declares_fewshot(manager, task) for task in tasks)
        out = simple_evaluate(
            model=lm,
            tasks=tasks,
            num_fewshot=None if zero_by_default else fewshot,
            task_manager=manager,
            limit=cfg.limit,
            bootstrap_iters=bootstrap_iters(cfg),
            log_samples=True,  # each item's score: what paired comparisons between rows resample
            # lm-eval's own defaults (the official code's); the job's seed stays out of the scores
            random_seed=0,
            numpy_random_seed=1234,
            torch_random_seed=1234,
            fewshot_random_seed=int(cfg.fewshot_seed),
        )
        results.update(out["results"])
        versions.update({task: _json_version(v) for task, v in (out.get("versions") or {}).items()})
        for part in logged:
            logged[part].update(out.get(part) or {})
    scores: dict[str, Any] = collect_scores(results, metrics, ppl_names)
    scores.update(collect_items(logged, metrics, dict(cfg.clusters or {})))
    shown = {k: v for k, v in scores.items() if isinstance(v, float)}
    log.info("harness: %s", {k: round(v, 4) if math.isfinite(v) else v for k, v in shown.items()})
    scores["eval_task_versions"] = dict(sorted(versions.items()))
    scores["eval_max_length_used"] = int(lm.max_length)
    return scores
