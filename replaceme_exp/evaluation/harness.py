"""lm-eval-harness on the in-memory model (no save and reload), with suites from the ``eval``
config group and the project's own offline tasks (local JSONL shipped in ``offline_tasks/``)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from replaceme_exp.data.sources import pack_paragraphs, pydoc_text

log = logging.getLogger(__name__)

OFFLINE_TASKS = Path(__file__).parent / "offline_tasks"
HUB_TASKS = Path(__file__).parent / "hub_tasks"  # hub-data tasks (eval=llama2_table), next to the defaults


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


def accuracy_column(entry: str) -> str:
    """``task`` -> ``acc_task``; ``task:metric`` -> ``metric_task`` (e.g. ``acc_norm``)."""
    task, _, metric = entry.partition(":")
    return f"{metric or 'acc'}_{task}"


def run_harness(model, tokenizer, cfg: DictConfig, work_dir: Path, seed: int = 0) -> dict[str, float]:
    """Scores of ``model`` on the suite ``cfg`` (``eval.harness``): ``acc_<task>``,
    ``acc_norm_<task>`` / ``exact_match_<task>`` where lm-eval reports them, ``ppl_<name>`` for
    perplexity tasks, and ``avg_acc`` over ``cfg.accuracy_tasks`` (``task`` or ``task:metric``)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    include = str(materialize_offline_tasks(Path(work_dir) / "lm_eval_tasks")) if cfg.local_tasks else str(HUB_TASKS)
    manager = TaskManager(include_path=include, include_defaults=not cfg.local_tasks, verbosity="ERROR")
    lm = HFLM(
        pretrained=model,
        tokenizer=tokenizer,
        batch_size=cfg.batch_size,
        add_bos_token=cfg.add_bos_token,
        max_length=cfg.get("max_length"),
    )
    by_fewshot: dict[int, list[str]] = {}
    for task, fewshot in OmegaConf.to_container(cfg.tasks).items():
        by_fewshot.setdefault(int(fewshot), []).append(task)
    ppl_names = OmegaConf.to_container(cfg.get("ppl_names") or {})
    scores: dict[str, float] = {}
    for fewshot, tasks in by_fewshot.items():
        out = simple_evaluate(
            model=lm,
            tasks=tasks,
            num_fewshot=fewshot,
            task_manager=manager,
            limit=cfg.get("limit"),
            bootstrap_iters=0,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            verbosity="ERROR",
        )
        for task, metrics in out["results"].items():
            for key, value in metrics.items():
                metric = key.split(",")[0]
                if not isinstance(value, (int, float)):
                    continue
                if metric in ("acc", "acc_norm", "exact_match"):
                    scores[f"{metric}_{task}"] = float(value)
                elif metric in ("perplexity", "word_perplexity"):
                    scores[f"ppl_{ppl_names.get(task, task)}"] = float(value)
    columns = [accuracy_column(entry) for entry in cfg.accuracy_tasks]
    missing = [c for c in columns if c not in scores]
    if missing:
        raise RuntimeError(f"lm-eval returned no {missing}; it returned {sorted(scores)}")
    scores["avg_acc"] = sum(scores[c] for c in columns) / len(columns)
    log.info("harness: %s", {k: round(v, 4) for k, v in scores.items()})
    return scores
