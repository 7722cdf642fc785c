"""LLM-Streamline (docs/methods/llm-streamline.md): the cut replaced by a lightweight network trained
on the calibration data, an FFN after the block before it or the cut's first block retrained
(``objective=streamline_ffn`` / ``streamline_layer``, ``experiment=llm_streamline`` / ``llm_streamline_layer``)."""

import dataclasses
from typing import Literal, Optional

from replaceme_exp.config import schema
from replaceme_exp.config.schema import (
    Group,
    ObjectiveConfig,
    finite_non_negative,
    finite_positive,
    key,
    positive_int,
    register_shape,
)
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.streamline import MIN_TRAINED_STEPS, StreamlineEstimator
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.selection.cuts import cut_length
from replaceme_exp.selection.metrics import METRICS


def adam_betas(v) -> str | None:
    ok = (
        isinstance(v, (list, tuple))
        and len(v) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v)
    )
    return None if ok else "must be two numbers in [0, 1): [beta1, beta2]"


@register_shape("objective")
@Group
class ReplacementObjectiveConfig(ObjectiveConfig):
    """LLM-Streamline (Chen et al., ICLR 2025): the cut is replaced by a lightweight network trained
    to map the cut's input hidden states to its output (MSE); the defaults are its authors' (its
    options under conf/objective/)."""

    replacement: Literal["ffn", "layer"] = key(
        doc="ffn: a new FFN after the block before the cut; layer: the cut's first block, retrained, replaces it"
    )
    ffn_expansion: int = key(4, doc="ffn: its hidden width as a multiple of the model's", check=positive_int)
    ffn_init: Literal["normal", "pytorch"] = key(
        "normal",
        doc="ffn: normal: weights from N(0, the model's initializer_range), zero biases (the authors' model class); "
        "pytorch: nn.Linear's default",
    )
    lr: float = key(2.0e-4, doc="AdamW's peak learning rate", check=finite_positive)
    min_lr: float = key(5.0e-5, doc="where the cosine schedule ends", check=finite_non_negative)
    weight_decay: float = key(1.0e-3, doc="AdamW's weight decay", check=finite_non_negative)
    betas: list[float] = key([0.9, 0.999], doc="AdamW's betas", check=adam_betas)
    batch_size: int = key(8, doc="calibration sequences per micro-batch", check=positive_int)
    grad_accumulation: int = key(16, doc="micro-batches per optimizer step", check=positive_int)
    epochs: int = key(1, doc="passes over the calibration sequences", check=positive_int)
    schedule_ratio: float = key(
        1.0, doc="the cosine schedule's length in micro-batches x epochs", check=finite_positive
    )
    warmup_ratio: float = key(0.0, doc="linear warm-up, a fraction of the schedule's length", check=finite_non_negative)
    scheduler_steps: Literal["optimizer_step", "micro_batch"] = key(
        "optimizer_step", doc="the schedule advances once per optimizer step or per micro-batch"
    )
    max_grad_norm: Optional[float] = key(None, doc="clip the gradient norm (null: no clipping)", check=finite_positive)


LABELS = {"ffn": "LLM-Streamline (FFN)", "layer": "LLM-Streamline (layer)"}


def retrained_block_fits(config: schema.JobConfig, shape: ModelShape) -> None:
    """The layer variant selects a cut one block longer than it removes: it fits the model."""
    if (
        config.objective.replacement != "layer"
        or config.cuts is not None
        or METRICS.get(config.selection.metric).searches
    ):
        return
    if cut_length(config.n_prune, config.num_lts, shape.num_layers) + 1 > shape.num_layers - 1:
        reason = f"objective={config.objective.name} retrains one block of a cut of n_prune + 1 blocks: "
        raise ConfigError("n_prune", config.n_prune, reason + f"at most {shape.num_layers - 2} here")


def one_cut_one_network(c, needs) -> None:
    """One selected (or given) cut replaced by one trained network, on the model it runs."""
    name = c.objective.name
    if c.cuts is not None and len(c.cuts) != 1:
        raise ConfigError("cuts", c.cuts, f"objective={name} replaces one cut by one network: give one cut")
    if c.cuts is None and c.num_lts != 1:
        raise ConfigError("num_lts", c.num_lts, f"objective={name} replaces one cut by one network (num_lts=1)")
    if c.cuts is None and METRICS.get(c.selection.metric).searches:
        reason = f"decides the removed blocks itself; objective={name} replaces a cut chosen by distance"
        raise ConfigError("selection.metric", c.selection.metric, reason)
    if c.cuts is not None and needs.replacement == "layer" and c.cuts[0][1] - c.cuts[0][0] < 2:
        reason = f"objective={name} keeps the cut's first block retrained: give a cut of at least 2 blocks"
        raise ConfigError("cuts", c.cuts, reason)
    if c.model.capture_4bit:
        raise ConfigError("model.capture_4bit", True, f"not with objective={name} (it trains on the model it prunes)")
    if float(c.mask_ratio):
        reason = f"not with objective={name} (it trains on the plain sequences)"
        raise ConfigError("mask_ratio", float(c.mask_ratio), reason)


FFN_ONLY = ("ffn_expansion", "ffn_init")


def without_unbuilt_ffn(c, data: dict) -> None:
    """The layer variant builds no FFN: its width and initialisation do not act."""
    if c.objective.replacement == "layer":
        for name in FFN_ONLY:
            data["objective"].pop(name)


def training_settings(c) -> dict:
    """The network and its training settings as they act (``ffn_expansion``, ``ffn_init`` only for the FFN)."""
    settings = dataclasses.asdict(c.objective)
    for name in ("_target_", "name"):
        settings.pop(name)
    if settings["replacement"] != "ffn":
        for name in FFN_ONLY:
            settings.pop(name)
    return {
        "replacement": c.objective.replacement,
        "replacement_epochs": c.objective.epochs,
        "replacement_settings": settings,
    }


register(
    Method(
        "llm_streamline",
        title="LLM-Streamline",
        docs="llm-streamline.md",
        label=lambda job: LABELS[job.config.objective.replacement],
        estimators=(StreamlineEstimator,),
        presets=("llm_streamline", "llm_streamline_layer", "llm_streamline_scaled"),
        check_shape=retrained_block_fits,
        check=one_cut_one_network,
        identity=without_unbuilt_ffn,
        setting_columns={
            "replacement": "LLM-Streamline's lightweight network: `ffn` or `layer` (None for every other method).",
            "replacement_epochs": "LLM-Streamline's passes over the calibration sequences (`objective.epochs`; None "
            "for every other method): tells the authors' recipe (1) from the one scaled to a calibration set.",
            "replacement_settings": "JSON: LLM-Streamline's training settings as they act (learning rates, AdamW, "
            "micro-batch, accumulation, epochs, schedule, clipping, FFN width and initialisation); None for other "
            "methods.",
        },
        settings_of=training_settings,
        column_docs={
            "replaced_cut": "LLM-Streamline: the selected cut `[start, end)` its network replaces (the layer variant "
            "keeps block `start`, retrained, and removes the rest).",
            "replacement_<quantity>": "LLM-Streamline's training: MSE over every calibration token before and after "
            "(`loss_before`, `loss_after`), first and last optimizer step's loss and the loss curve, optimizer steps, "
            "the highest learning rate an optimizer step used (`lr_max`), sequences, tokens, parameters added (the "
            "FFN's; 0 for the layer), the standard deviation the FFN's weights were drawn with (`init_std`; None: "
            "PyTorch's default, or the layer).",
            "untrained": f"LLM-Streamline: True when its training did not act: fewer than {MIN_TRAINED_STEPS} "
            "optimizer steps, or none at a learning rate above 0 (the layer variant is then the plain removal of "
            "the cut's other blocks; the FFN stays near its random initialisation); tables mark the row "
            "`(untrained)`.",
        },
    )
)
