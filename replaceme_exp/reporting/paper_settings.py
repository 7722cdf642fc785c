"""The paper's settings, shared by ``paper_tables`` and ``paper_figures``, and how they are
retargeted to runs of another model, calibration set or eval suite (``make paper-tables MODEL=
CALIBRATION= EVAL=``).

A :class:`Target` names the model, calibration and eval suite to read instead of the paper's
(None: the paper's). A :class:`Retargeting` applies it to the merged conditions of every table
cell and figure point and remembers what it changed, for the caption:

- ``model``: every ``model`` condition becomes the target model, and ``n_prune`` keeps its
  fraction of the depth: the paper's n over the paper model's depth (:data:`PAPER_DEPTHS`) times
  the target's ``num_layers`` (read from its finished runs), rounded half up: 25% of 32 blocks
  (8) is 2 of tiny_llama's 6 and 8 of SmolLM2's 30. Where the target's runs record no depth, or
  disagree, n_prune is left unmatched (:class:`Unresolved`) rather than guessed.
- ``calibration``: the paper's default data (``slimorca``) becomes the target calibration, and its
  8000 samples the target calibration's default ``n_samples`` (``conf/calibration/<name>.yaml``);
  rows that name other data (fineweb, sciq) or other sizes (1000) keep theirs. A table beyond the
  paper names its own default data and size (:class:`Retargeting`'s ``home``).
- ``n_prune`` given as :class:`~replaceme_exp.reporting.cells.FractionOfDepth` holds at any depth and
  is left as it is.
- ``eval``: every ``eval`` condition becomes the target suite; a perplexity column the target
  suite does not record (Lambada OpenAI's ``ppl_lambada`` outside ``eval=paper``) reads the
  suite's own perplexity (its harness's, else the held-out ``ppl_heldout`` every run records) and
  its header names it.

:class:`Tally` counts, per table or figure, the runs found (finished runs of the model,
calibration and eval of some cell), matched (of some cell's conditions) and shown (in the shown
setting of a cell), and explains a 0 matched.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from replaceme_exp.reporting.cells import FractionOfDepth, _value_text, matches
from replaceme_exp.reporting.paper_records import setting
from replaceme_exp.row_format import PERPLEXITY_METRICS, metric_column

# The paper's named condition sets (paper.yaml's settings): DEFAULT_METHOD is its setting unless a
# table or row says otherwise; PEER_METHOD lifts the ReplaceMe settings for a row picked by its method.
DEFAULT_METHOD = setting("default_method")
LLAMA3_25 = setting("llama3_25")
PEER_METHOD = setting("peer_method")
MULTI_LT_NC = setting("multi_lt_nc")

PAPER_CALIBRATION = DEFAULT_METHOD["calibration"]
PAPER_CALIB_SAMPLES = DEFAULT_METHOD["n_calib_samples"]
# The number of transformer blocks of the paper's models (num_hidden_layers in each checkpoint's
# config.json on the Hugging Face hub: meta-llama/Llama-2-7b-hf, Meta-Llama-3-8B-Instruct,
# Llama-3.1-8B-Instruct, Llama-3.2-1B-Instruct, Meta-Llama-3-70B-Instruct,
# mistralai/Mistral-7B-Instruct-v0.3, Qwen/Qwen2.5-7B-Instruct, tiiuae/falcon-11B; openai/clip-vit-large-patch14's
# vision_config), by the name of their conf/model config.
PAPER_DEPTHS = {
    "llama2_7b": 32,
    "llama3_8b_instruct": 32,
    "llama31_8b_instruct": 32,
    "llama32_1b_instruct": 16,
    "llama3_70b_instruct": 80,
    "mistral_7b_instruct_v03": 32,
    "qwen25_7b_instruct": 28,
    "falcon2_11b": 60,
    "clip_vit_l14": 24,
}
PAPER_MODEL_NAMES = {
    "llama2_7b": "Llama 2 7B",
    "llama3_8b_instruct": "Llama 3 8B Instruct",
    "llama31_8b_instruct": "Llama 3.1 8B Instruct",
    "llama32_1b_instruct": "Llama 3.2 1B Instruct",
    "llama3_70b_instruct": "Llama 3 70B Instruct",
    "mistral_7b_instruct_v03": "Mistral 7B Instruct v0.3",
    "qwen25_7b_instruct": "Qwen 2.5 7B Instruct",
    "falcon2_11b": "Falcon 2 11B",
    "clip_vit_l14": "CLIP ViT-L/14",
}
RETARGET_KEYS = ("model", "calibration", "eval")
HELDOUT_PPL = "ppl_heldout"  # every run's held-out perplexity (eval.text)
# The unpruned model's value of a metric, by the columns that may hold it (first present wins):
# baseline_<metric> (the harness's scores), and the older or differently named ones.
BASELINE_ALIASES = {"avg_acc": ["avg_acc_baseline"], HELDOUT_PPL: ["ppl_heldout_baseline"]}
# conf/ of this repository (the parent of the replaceme_exp package).
CONF = Path(__file__).resolve().parents[2] / "conf"


def baseline_columns(metric: str) -> list[str]:
    """The columns that may hold the unpruned model's ``metric``, most specific first."""
    return [f"baseline_{metric}", *BASELINE_ALIASES.get(metric, [])]


class Unresolved:
    """A condition that could not be translated (e.g. n_prune without the target's depth): it
    matches no run, and :func:`select_cell` returns nothing for it."""

    def __init__(self, reason: str):
        self.reason = reason

    def __str__(self) -> str:
        return f"unresolved ({self.reason})"

    __repr__ = __str__


def select_cell(frame: pd.DataFrame, conditions: dict) -> pd.DataFrame:
    """The rows of ``frame`` matching ``conditions`` (:func:`selection.matches`); none when a
    condition is :class:`Unresolved`."""
    if frame.empty or any(isinstance(v, Unresolved) for v in conditions.values()):
        return frame.iloc[0:0]
    return frame[matches(frame, conditions)]


def finished_runs(runs: pd.DataFrame, modality: str | None = None) -> pd.DataFrame:
    """The finished pruning runs (an evaluate job's row, ``job=evaluate``, prunes nothing: the
    pruning row of its checkpoint already holds its numbers); with ``modality``, only those of
    that kind of model (:func:`row_modalities`): a table of text models never reads a CLIP run,
    nor the CLIP table a text model's, whatever ``MODEL=`` retargets it to."""
    return _pruning_runs(runs, "finished", modality)


def _pruning_runs(runs: pd.DataFrame, status: str, modality: str | None) -> pd.DataFrame:
    if runs.empty or "status" not in runs.columns:
        return runs.iloc[0:0]
    pruning = runs["job"] != "evaluate" if "job" in runs.columns else True
    kept = (runs["status"] == status) & pruning
    if modality is not None:
        kept &= row_modalities(runs) == modality
    return runs[kept]


def latest_failure(runs: pd.DataFrame, conditions: dict, modality: str | None = None) -> pd.Series | None:
    """The latest failed pruning run (by ``started_at``) whose columns match ``conditions``, None
    when there is none: what a cell no finished run fills can say instead of nothing. A failed run
    records ``n_prune`` as asked, before the depth resolved it (``0.25``, no ``num_layers``), so a
    :class:`FractionOfDepth` condition also holds for the fraction itself."""
    if "error" not in runs.columns:
        return None
    failed = _pruning_runs(runs, "failed", modality)
    plain = {k: v for k, v in conditions.items() if not isinstance(v, FractionOfDepth)}
    mask = matches(failed, plain)
    for key, value in conditions.items():
        if isinstance(value, FractionOfDepth):
            asked = pd.to_numeric(failed.get(key), errors="coerce").sub(value.fraction).abs() < 1e-12
            mask &= value.mask(failed) | asked
    found = failed[mask]
    if found.empty:
        return None
    return found.sort_values("started_at").iloc[-1] if "started_at" in found.columns else found.iloc[-1]


def latest_short_run(runs: pd.DataFrame, conditions: dict, modality: str | None = None) -> pd.Series | None:
    """The latest finished pruning run that matches ``conditions`` but for the blocks it removed:
    it asked for a :class:`FractionOfDepth` condition's compression (``n_prune_asked``) and removed
    another number (a search that stopped short). None when there is none, or no such condition."""
    depth = {k: v for k, v in conditions.items() if isinstance(v, FractionOfDepth)}
    if not depth:
        return None
    finished = finished_runs(runs, modality)
    mask = matches(finished, {k: v for k, v in conditions.items() if k not in depth})
    for value in depth.values():
        mask &= value.asked(finished) & ~value.mask(finished)
    found = finished[mask]
    if found.empty:
        return None
    return found.sort_values("started_at").iloc[-1] if "started_at" in found.columns else found.iloc[-1]


# Columns only a vision encoder's run records (pipeline/vision.py): a row from before the
# ``modality`` column is a vision run when it has one of them.
VISION_ONLY_COLUMNS = ("eval_benchmarks", "vision_compression_ratio")


def row_modalities(runs: pd.DataFrame) -> pd.Series:
    """Each run's kind of model, ``text`` or ``vision``: its ``modality`` column, else (a row written
    before the column existed) ``vision`` where it records a vision-only column, else ``text``."""
    vision = pd.Series(False, index=runs.index)
    for column in VISION_ONLY_COLUMNS:
        if column in runs.columns:
            vision |= runs[column].notna()
    inferred = vision.map({True: "vision", False: "text"})
    if "modality" not in runs.columns:
        return inferred
    return runs["modality"].where(runs["modality"].notna(), inferred)


def read_config(group: str, name: str, conf: Path = CONF, _seen: tuple = ()) -> dict:
    """``conf/<group>/<name>.yaml`` with the same-group configs of its ``defaults`` list merged
    under it (enough for the keys read here); raises OSError / yaml errors when unreadable."""
    data = yaml.safe_load((Path(conf) / group / f"{name}.yaml").read_text()) or {}
    merged: dict = {}
    for entry in data.pop("defaults", None) or []:
        # a same-group option (not _self_, not a schema: /schema/<group>/<shape>@_here_)
        if isinstance(entry, str) and entry != "_self_" and not entry.startswith("/") and entry not in _seen:
            merged = _deep_merge(merged, read_config(group, entry, conf, (*_seen, name)))
    return _deep_merge(merged, data)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def suite_perplexities(suite: str, conf: Path = CONF) -> list[tuple[str, str]]:
    """The perplexity columns a suite's harness records, as (column, task), in declaration order
    (``eval.harness.metrics`` / ``ppl_names``, as ``row_format.metric_column`` names them)."""
    harness = read_config("eval", suite, conf).get("harness") or {}
    names = harness.get("ppl_names") or {}
    metrics = harness.get("metrics") or {}
    return [(metric_column(t, m, names), t) for t, m in metrics.items() if m in PERPLEXITY_METRICS]


def _most_common(frame: pd.DataFrame, key: str) -> tuple[str | None, str]:
    """The most common value of ``key`` among ``frame``'s runs (ties: the latest run's), and how
    it was inferred (``3 finished runs: pydoc 3``)."""
    if key not in frame.columns or frame[key].isna().all():
        return None, f"no run records {key}"
    values = frame[key].dropna().astype(str)
    counts = Counter(values)
    top = max(counts.values())
    tied = {v for v, n in counts.items() if n == top}
    if len(tied) == 1:
        value = tied.pop()
    else:
        started = frame.loc[values.index, "started_at"].astype(str) if "started_at" in frame else None
        order = values.index if started is None else started.sort_values(kind="mergesort").index
        value = next(values[i] for i in reversed(list(order)) if values[i] in tied)
    spread = ", ".join(f"{v} {n}" for v, n in counts.most_common())
    return value, f"inferred from {len(values)} finished run{'s' if len(values) != 1 else ''}: {spread}"


@dataclass
class Target:
    """The model, calibration and eval suite to render the paper's tables from (None: the
    paper's), with what :func:`resolve_target` read from the runs and configs."""

    model: str | None = None
    calibration: str | None = None
    eval: str | None = None
    inferred: dict = field(default_factory=dict)  # key -> how it was inferred
    depth: int | None = None  # the target model's num_layers, from its runs
    depth_problem: str | None = None
    calib_samples: int | None = None  # the target calibration's default n_samples
    calib_samples_problem: str | None = None
    protocol: str = "paper"  # the runs' protocol: paper (the paper's text) or official (the official code's)
    ppl: tuple[str, str] | None = None  # (column, what it measures) of the target suite's perplexity
    suite_ppl_columns: tuple = ()  # the perplexity columns the target suite records
    notes: list = field(default_factory=list)  # what resolving could not do

    @property
    def retargeted(self) -> bool:
        return any(getattr(self, key) is not None for key in RETARGET_KEYS) or self.protocol != "paper"

    def settings(self) -> dict:
        return {key: getattr(self, key) for key in RETARGET_KEYS if getattr(self, key) is not None}

    def overrides(self) -> str:
        """``model=tiny_llama calibration=pydoc eval=quick`` (as run.py takes them)."""
        return " ".join(f"{k}={v}" for k, v in self.settings().items())

    def folder(self) -> str:
        """The output subfolder of a retargeted rendering: ``<model>[_<calibration>][_<eval>]``,
        then ``protocol_official`` for the official protocol's runs."""
        parts = list(self.settings().values()) + ([f"protocol_{self.protocol}"] if self.protocol != "paper" else [])
        return "_".join(parts)

    def describe(self) -> str:
        """One line for the printout: the target and what was inferred or read for it."""
        parts = [f"protocol={self.protocol}"] if self.protocol != "paper" else []
        for key, value in self.settings().items():
            how = f" ({self.inferred[key]})" if key in self.inferred else ""
            parts.append(f"{key}={value}{how}")
        if self.model is not None:
            parts.append(f"depth: {self.depth} blocks" if self.depth else f"depth unknown: {self.depth_problem}")
        if self.calib_samples is not None and self.calibration != PAPER_CALIBRATION:
            parts.append(f"{PAPER_CALIB_SAMPLES} samples -> {self.calib_samples} ({self.calibration}'s default)")
        if self.ppl is not None:
            parts.append(f"perplexity: {self.ppl[0]} ({self.ppl[1]})")
        return "; ".join(parts + self.notes)


def resolve_target(
    runs: pd.DataFrame,
    model: str | None = None,
    calibration: str | None = None,
    eval: str | None = None,  # noqa: A002 - the config group's name
    conf: Path = CONF,
    protocol: str = "paper",
) -> Target:
    """The :class:`Target` of these settings: with a model, the calibration and eval not given
    are the most common among its finished runs (ties: the latest run's); its depth is the
    ``num_layers`` its finished runs record; the calibration's default size and the suite's
    perplexity come from ``conf/``."""
    target = Target(model, calibration, eval, protocol=protocol)
    finished = finished_runs(runs)
    if model is not None:
        own = select_cell(finished, target.settings())  # the model's runs, of the given calibration / eval
        for key in ("calibration", "eval"):
            if getattr(target, key) is not None:
                continue
            if own.empty:
                target.notes.append(f"{key} not inferred: no finished run of model={model}")
                continue
            value, how = _most_common(own, key)
            if value is None:
                target.notes.append(f"{key} not inferred: {how}")
                continue
            setattr(target, key, value)
            target.inferred[key] = how.replace(" finished run", f" finished {model} run")
            own = select_cell(own, {key: value})
        mine = select_cell(finished, {"model": model})
        depths = pd.to_numeric(mine["num_layers"], errors="coerce").dropna() if "num_layers" in mine else pd.Series()
        if depths.empty:
            target.depth_problem = f"no finished run of {model} records num_layers"
        elif depths.nunique() > 1:
            found = ", ".join(f"{d:g}" for d in sorted(depths.unique()))
            target.depth_problem = f"the runs of {model} record num_layers in {{{found}}}"
        else:
            target.depth = int(depths.iloc[0])
    if target.calibration is not None:  # a table's default data becomes it at its default size
        try:
            target.calib_samples = int(read_config("calibration", target.calibration, conf)["n_samples"])
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError) as err:
            target.calib_samples_problem = (
                f"conf/calibration/{target.calibration}.yaml gives no n_samples ({type(err).__name__}): "
                "the table's number of samples is not required"
            )
    if target.eval is not None:
        try:
            recorded = suite_perplexities(target.eval, conf)
        except (OSError, yaml.YAMLError) as err:
            recorded = []
            target.notes.append(f"conf/eval/{target.eval}.yaml unreadable ({type(err).__name__})")
        target.suite_ppl_columns = tuple(c for c, _ in recorded)
        if recorded:
            target.ppl = (recorded[0][0], f"{recorded[0][1]}, eval={target.eval}")
        else:
            target.ppl = (HELDOUT_PPL, "held-out text")
    return target


def translate_n_prune(n: float, paper_depth: int, depth: int) -> int:
    """The paper's ``n`` of ``paper_depth`` blocks as blocks of a ``depth``-block model: the same
    fraction, rounded half up (8 of 32 -> 2 of 6, 8 of 30)."""
    return int(math.floor(n / paper_depth * depth + 0.5))


# eval=clip_offline: the CLIP table's columns -> (the bundled-image benchmark's column, its header)
OFFLINE_CLIP_COLUMNS = {
    "text_recall5_mscoco": ("text_recall5_bundled_captions", "Bundled captions text recall@5"),
    "vision_recall5_mscoco": ("vision_recall5_bundled_captions", "Bundled captions vision recall@5"),
    "acc1_cifar10": ("acc1_bundled_objects", "Bundled objects acc1"),
    "acc5_cifar10": ("acc5_bundled_objects", "Bundled objects acc5"),
}


# The calibration a paper table stands for by default (retargeted by CALIBRATION=), and its size.
PAPER_HOME = {"calibration": PAPER_CALIBRATION, "n_calib_samples": PAPER_CALIB_SAMPLES}


class Retargeting:
    """Applies a :class:`Target` to conditions and metrics, and remembers what it changed (for
    the caption of one table or figure). With no target (or the paper's) it changes nothing.

    ``home``: the calibration (and its size) a table reads by default, which a target calibration
    replaces (the paper's SlimOrca and 8000 samples, :data:`PAPER_HOME`); ``reference``: how the
    caption names the settings replaced (``paper: Llama 3 8B Instruct``)."""

    def __init__(self, target: Target | None = None, home: dict | None = None, reference: str = "paper"):
        self.target = target or Target()
        self.home = {**PAPER_HOME, **(home or {})}
        self.reference = reference
        self.replaced: dict[str, list] = {key: [] for key in RETARGET_KEYS}
        self.fractions: dict[float, int] = {}
        self.calib_samples = False
        self.ppl_replaced: list[str] = []
        self.clip_replaced: list[str] = []
        self.problems: list[str] = []
        self.seen: set[str] = set()  # the target's keys that some condition named

    @property
    def active(self) -> bool:
        return self.target.retargeted

    def _replace(self, key: str, old) -> None:
        if old != getattr(self.target, key) and old not in self.replaced[key]:
            self.replaced[key].append(old)

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def conditions(self, conditions: dict) -> dict:
        """``conditions`` with the target applied (see the module docstring)."""
        t, out = self.target, dict(conditions)
        out["protocol"] = t.protocol
        if t.protocol == "official" and out.get("selection_metric") == "cosine":  # conf/protocol/official.yaml
            out["selection_metric"] = "angular_last"
        if not self.active:
            return out
        self.seen |= set(conditions) & set(RETARGET_KEYS)
        if t.model is not None and "model" in conditions:
            paper_model = conditions["model"]
            self._replace("model", paper_model)
            out["model"] = t.model
            n = conditions.get("n_prune")
            if n is not None and paper_model != t.model and not isinstance(n, FractionOfDepth):  # any depth's
                out["n_prune"] = self._n_prune(paper_model, n)
        home, home_samples = self.home["calibration"], self.home["n_calib_samples"]
        if t.calibration is not None and conditions.get("calibration") == home:
            self._replace("calibration", home)
            out["calibration"] = t.calibration
            if t.calibration != home and conditions.get("n_calib_samples") == home_samples:
                if t.calib_samples is not None:
                    out["n_calib_samples"] = t.calib_samples
                    self.calib_samples = True
                else:
                    del out["n_calib_samples"]
                    self._problem(str(t.calib_samples_problem))
        if t.eval is not None and "eval" in conditions:
            self._replace("eval", conditions["eval"])
            out["eval"] = t.eval
        return out

    def _n_prune(self, paper_model, n):
        paper_depth = PAPER_DEPTHS.get(paper_model)
        if paper_depth is None:
            reason = f"the depth of {paper_model} is not in PAPER_DEPTHS"
        elif self.target.depth is None:
            reason = str(self.target.depth_problem)
        else:
            translated = translate_n_prune(float(n), paper_depth, self.target.depth)
            self.fractions[float(n) / paper_depth] = translated
            return translated
        self._problem(f"n_prune left unmatched: {reason}")
        return Unresolved(reason)

    def metric(self, metric: str) -> tuple[str, str | None]:
        """The column to read for ``metric`` and, when it changed, the header naming it: a
        perplexity the target suite does not record becomes the suite's own; with
        ``eval=clip_offline`` the CLIP table's columns read the bundled-image benchmarks."""
        t = self.target
        if metric == HELDOUT_PPL:  # every text run records it, whatever its suite
            return metric, None
        if t.eval == "clip_offline" and metric in OFFLINE_CLIP_COLUMNS:
            column, header = OFFLINE_CLIP_COLUMNS[metric]
            if metric not in self.clip_replaced:
                self.clip_replaced.append(metric)
            return column, header
        if t.eval is None or t.ppl is None or not metric.startswith("ppl_") or metric in t.suite_ppl_columns:
            return metric, None
        if metric not in self.ppl_replaced:
            self.ppl_replaced.append(metric)
        return t.ppl[0], f"Perplexity ({t.ppl[0]}, {t.ppl[1]})"

    def caption(self) -> str | None:
        """What was rendered instead of the paper's settings, or None when nothing changed."""
        if not self.active:
            return None
        t, parts = self.target, []
        if t.protocol == "official":
            parts.append("protocol=official (the official code's settings, conf/protocol/official.yaml)")
        for key in RETARGET_KEYS:
            value = getattr(t, key)
            if value is None or key not in self.seen:
                continue
            paper = [PAPER_MODEL_NAMES.get(v, str(v)) if key == "model" else str(v) for v in self.replaced[key]]
            why = [f"{self.reference}: {', '.join(paper)}"] if paper else []
            if key in t.inferred:
                why.append(t.inferred[key].split(":")[0])
            parts.append(f"{key}={value}" + (f" ({'; '.join(why)})" if why else ""))
        text = "Rendered from runs of " + ", ".join(parts)
        if len(self.replaced["model"]) > 1:
            text += f"; every paper model is read as {t.model}"
        if self.fractions:
            text += "; " + ", ".join(
                f"{100 * f:g}% = {n} of {t.depth} blocks" for f, n in sorted(self.fractions.items())
            )
        if self.calib_samples:
            samples = self.home["n_calib_samples"]
            text += f"; {samples} calibration samples = {t.calibration}'s default {t.calib_samples}"
        if self.ppl_replaced:
            text += f"; perplexity: {t.ppl[0]} ({t.ppl[1]}) instead of {', '.join(self.ppl_replaced)}"
        if self.clip_replaced:
            text += "; the offline bundled-image benchmarks stand in for MS-COCO and CIFAR-10 (VOC2007, EuroSAT: none)"
        return text + "".join(f"; {p}" for p in self.problems) + "."


def _text(value) -> str:
    if value is None:
        return "None"
    return str(value) if isinstance(value, Unresolved) else _value_text(value)


def _values(frame: pd.DataFrame, key: str) -> str:
    if key not in frame.columns:
        return f"no {key} column"

    def order(text: str) -> tuple:
        try:
            return (0, float(text), "")
        except ValueError:
            return (1, 0.0, text)

    return "{" + ", ".join(sorted({_value_text(v) for v in frame[key]}, key=order)) + "}"


@dataclass
class Tally:
    """The runs one table or figure found, matched and showed (indices into the runs frame)."""

    cells: list = field(default_factory=list)  # (finished runs, conditions) of every measured cell
    found: set = field(default_factory=set)
    matched: set = field(default_factory=set)
    shown: set = field(default_factory=set)

    def cell(self, finished: pd.DataFrame, conditions: dict, keep=None, kept: str = "") -> pd.DataFrame:
        """The runs of ``finished`` matching ``conditions`` (then ``keep``, a frame filter whose
        runs are those that ``kept`` says, e.g. "record layer_distances"), counted as found (by
        model, calibration and eval) and matched."""
        self.cells.append((finished, conditions, keep, kept))
        self.found |= set(select_cell(finished, {k: v for k, v in conditions.items() if k in RETARGET_KEYS}).index)
        selected = select_cell(finished, conditions)
        if keep is not None and not selected.empty:
            selected = keep(selected)
        self.matched |= set(selected.index)
        return selected

    def show(self, runs: pd.DataFrame | None) -> None:
        if runs is not None:
            self.shown |= set(runs.index)

    def settings(self) -> str:
        """``model=tiny_llama, calibration=pydoc, eval=quick`` over the cells (``in {..}`` when
        the cells name several values)."""
        parts = []
        for key in RETARGET_KEYS:
            values = sorted({str(c[key]) for _, c, _, _ in self.cells if key in c})
            if len(values) == 1:
                parts.append(f"{key}={values[0]}")
            elif values:
                parts.append(f"{key} in {{{', '.join(values)}}}")
        return ", ".join(parts) or "any model, calibration and eval"

    def hint(self) -> str | None:
        """Why no run matched although runs were found: runs that meet a cell's conditions but
        not its filter; else the first condition of a cell (in order) whose relaxation alone lets
        some found run match, with the values they have; else the conditions of the first cell
        that no found run meets."""
        if self.matched or not self.found:
            return None
        for finished, conditions, keep, kept in self.cells:
            if keep is not None and not (meet := select_cell(finished, conditions)).empty:
                return f"0 matched: {len(meet)} run(s) meet the conditions but none {kept or 'passes the filter'}"
        unmet = None
        for finished, conditions, _, _ in self.cells:
            found = finished[finished.index.isin(self.found)]
            for key, wanted in conditions.items():
                relaxed = select_cell(found, {k: v for k, v in conditions.items() if k != key})
                if not relaxed.empty:
                    return f"0 matched: {key}={_text(wanted)} wanted, runs have {key} in {_values(relaxed, key)}"
            if unmet is None and not found.empty:
                unmet = [
                    f"{k}={_text(v)} wanted, runs have {k} in {_values(found, k)}"
                    for k, v in conditions.items()
                    if select_cell(found, {k: v}).empty
                ]
        return "0 matched: the found runs miss several conditions of every cell, e.g. " + "; ".join(unmet or [])

    def line(self, name: str, what: str = "a cell") -> str:
        """``structured_lts: 3 runs found (model=.., calibration=.., eval=..), 3 matched a cell,
        3 shown`` (with the hint when none matched)."""
        text = (
            f"{name}: {len(self.found)} run{'s' if len(self.found) != 1 else ''} found ({self.settings()}), "
            f"{len(self.matched)} matched {what}, {len(self.shown)} shown"
        )
        hint = self.hint()
        return text + (f"; {hint}" if hint else "")
