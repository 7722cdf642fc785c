"""The rules that join several keys of a job's configuration, checked before anything loads.

Each key's own type and range are the schema's (:mod:`replaceme_exp.config.schema`); here is what
depends on several keys, on the estimator's declared needs, on the machine (bitsandbytes, a GPU)
or on files the job will read. Every rule raises one :class:`~replaceme_exp.errors.ConfigError`
naming the key, the value and the reason.

:func:`check_job` and :func:`check_evaluation` are cheap (a file is only opened, to know it can be
read): they run wherever a configuration is resolved. :func:`check_inputs` reads what the job will
read (the contents of its files, the hub datasets it needs), once, when the job is about to run.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch

from replaceme_exp.capture.distributed import Ranks, ranks_from_env
from replaceme_exp.config import schema
from replaceme_exp.config.depth import blocks_to_prune
from replaceme_exp.config.validate import build_option
from replaceme_exp.data import CALIBRATION_SOURCES
from replaceme_exp.data.files import check_readable, check_text
from replaceme_exp.data.hub import HubDataset, require_available
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import Requirements, estimator_class
from replaceme_exp.evaluation.clip_benchmarks import benchmark_datasets
from replaceme_exp.evaluation.harness import check_suite
from replaceme_exp.evaluation.task_datasets import suite_datasets
from replaceme_exp.methods import job_methods
from replaceme_exp.models.adapters import unfusable_error
from replaceme_exp.models.embedded import embedded_model
from replaceme_exp.models.loading import check_nf4_capture
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.pipeline.modalities import MODALITIES, modality_of
from replaceme_exp.selection.cuts import cut_length, validate_cuts
from replaceme_exp.selection.metrics import METRICS

def writable_directory(key: str, value, subfolders: Iterable[str] = ()) -> None:
    """``value`` names a directory this process can create and write, and so does each of its
    ``subfolders`` (paths relative to it): the folder itself where it exists, else its nearest
    existing parent, must be a writable directory."""
    if not isinstance(value, str) or not value:
        raise ConfigError(key, value, "must be a directory path")
    root = Path(value).expanduser()
    for folder in (root, *(root / sub for sub in subfolders)):
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.exists() and not existing.is_dir():
            raise ConfigError(key, value, f"{existing} is a file, not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(key, value, f"{existing} is not writable")


def model_save(c: schema.JobConfig) -> str | None:
    """What a finished job leaves of its pruned model: ``full`` (the checkpoint under
    ``models/<config_hash>``), ``transform`` (the cuts and each T under ``transforms/``, from which
    ``make export`` rebuilds the checkpoint) or None (``save_model=false``, an evaluate job). A
    healed model's weights moved beyond its transforms: ``transform`` saves it ``full``."""
    if c.job != "prune" or c.save_model is False:
        return None
    if c.save_model == "transform" and c.healing.name == "none":
        return "transform"
    return "full"


def results_subfolders(c: schema.JobConfig, config_hash: str | None = None) -> list[str]:
    """The folders under ``results_dir`` a job writes to: its rows (``runs``; ``runs/<config_hash>``
    once the hash is known), the configurations' locks, cached baselines and, as configured, the
    saved model (``models``, ``models/<config_hash>``) and transforms."""
    folders = ["runs", "locks", "baselines"]
    saved = model_save(c)
    if saved == "full":
        folders.append("models")
    if c.job == "prune" and (c.save_transforms or saved == "transform"):
        folders.append("transforms")
    if config_hash is not None:
        folders += [f"{folder}/{config_hash}" for folder in ("runs", "models") if folder in folders]
    return folders


def existing_file(key: str, value) -> None:
    """``value`` (a path or a list of paths) names files this process can read (their contents are
    :func:`check_inputs`'s)."""
    check_readable(key, value)


def check_job(c: schema.JobConfig, needs: Requirements) -> None:
    """Every cross-key rule of a pruning job ``c`` for an estimator with ``needs``; the first broken
    one raises."""
    writable_directory("results_dir", c.results_dir, results_subfolders(c))
    writable_directory("cache_dir", c.cache_dir)
    if c.capture.cache or c.capture.search_steps and c.cuts is None and METRICS.get(c.selection.metric).stepwise:
        writable_directory("capture.cache_dir", c.capture.cache_dir)  # the statistics, a stepwise search's steps
    for key, value in (("checkpoint", c.evaluate.checkpoint), ("dtype", c.evaluate.dtype)):
        if value is not None:
            raise ConfigError(f"evaluate.{key}", value, "is for job=evaluate (this job prunes model; add job=evaluate)")
    check_embedded(c.model)
    modality = MODALITIES.get(modality_of(c.model))
    check_selection(c, needs)
    check_method(c, needs)
    check_official_settings(c, needs)
    check_data(c, modality.name)
    modality.check(c)
    check_hardware(c)
    check_ranks(c, needs, ranks_from_env())


def check_ranks(c: schema.JobConfig, needs: Requirements, ranks: Ranks | None) -> None:
    """A job over several processes (``ranks``; None: one process) splits its calibration captures:
    every rank needs a batch, the whole model on its own device, and a method whose captures merge
    (:mod:`replaceme_exp.capture.merge`)."""
    if ranks is None:
        return
    world = ranks.world_size
    size = c.calibration.batch_size
    drop_last = getattr(c.calibration, "drop_last", None)
    batches = c.calibration.n_samples // size if drop_last else -(-c.calibration.n_samples // size)
    if batches < world:
        reason = f"{batches} calibration batches of {size} for {world} ranks: each rank needs at least one batch"
        raise ConfigError("calibration.n_samples", c.calibration.n_samples, reason)
    if c.capture.mode == "layerwise":
        raise ConfigError("capture.mode", "layerwise", f"not with {world} ranks (each rank captures the whole model)")
    if c.model.device_map is not None:
        reason = f"not with {world} ranks (each rank holds the whole model on its own device)"
        raise ConfigError("model.device_map", c.model.device_map, reason)
    if c.cuts is None and METRICS.get(c.selection.metric).searches:
        reason = f"searches on the whole model, step by step: not split over {world} ranks (run one process)"
        raise ConfigError("selection.metric", c.selection.metric, reason)
    if needs.replacement is not None:
        reason = f"trains a replacement network: not split over {world} ranks (run one process)"
        raise ConfigError("objective", c.objective.name, reason)


def check_embedded(model: schema.ModelConfig) -> None:
    """An embedded model (``source: embedded``) is named by ``model.pretrained`` among those the
    project embeds. Whether its wheels are installed is checked when its shape is read, before the
    load (it depends on the machine, not on the configuration)."""
    if model.source == "embedded":
        embedded_model(model.pretrained)


def overridden_keys(overrides: list[str]) -> set[str]:
    """The keys a command line's overrides set (``+key=v``, ``++key=v``, ``~key`` included)."""
    return {o.lstrip("+~").split("=", 1)[0] for o in overrides if isinstance(o, str)}


def check_given_together(c: schema.JobConfig, given: set[str]) -> None:
    """Keys set together on the command line (``given``) where one overrides the other: explicit
    ``cuts`` decide what is pruned, so an ``n_prune`` or ``num_lts`` given beside them must agree."""
    if c.cuts is None or not isinstance(c.cuts, list):
        return
    pairs = [cut for cut in c.cuts if isinstance(cut, list) and len(cut) == 2 and all(type(v) is int for v in cut)]
    if len(pairs) != len(c.cuts):
        return  # the cuts' own check names what is wrong with them
    blocks = sum(end - start for start, end in pairs)
    shown = [list(cut) for cut in pairs]
    if "n_prune" in given and not (type(c.n_prune) is int and c.n_prune == blocks):
        reason = f"not with explicit cuts={shown}, which prune {blocks} blocks (drop n_prune, or give n_prune={blocks})"
        raise ConfigError("n_prune", c.n_prune, reason)
    if "num_lts" in given and c.num_lts != len(pairs):
        reason = f"not with explicit cuts={shown}, which are {len(pairs)} (drop num_lts, or give num_lts={len(pairs)})"
        raise ConfigError("num_lts", c.num_lts, reason)


def check_shape(c: schema.JobConfig, shape: ModelShape) -> None:
    """The keys that need the model's depth, width, positions or family, against its config (before
    the load): the cuts (or ``n_prune`` and ``num_lts``) fit its blocks, and each of the job's
    methods' own rules (:attr:`~replaceme_exp.methods.Method.check_shape`), no sequence is longer than
    its position embeddings, no T is fused where its family makes that inexact (:func:`check_fusable`)."""
    if c.job == "prune":
        check_fusable(c, shape)
        if c.cuts is not None:
            validate_cuts(c.cuts, shape.num_layers, c.merge_consecutive, c.touching_cuts)
        elif METRICS.get(c.selection.metric).searches:  # the search decides the cuts: any removed blocks
            if blocks_to_prune(c.n_prune, shape.num_layers) > shape.num_layers - 1:
                reason = f"the model has {shape.num_layers} blocks; at most {shape.num_layers - 1} can be removed"
                raise ConfigError("n_prune", c.n_prune, reason)
        else:
            cut_length(c.n_prune, c.num_lts, shape.num_layers)
        for method in job_methods(c):
            if method.check_shape is not None:
                method.check_shape(c, shape)
        check_calibration_tokens(c, shape)
    if shape.max_positions is None:
        return
    lengths = [("eval.seq_len", getattr(c.eval, "seq_len", None))]
    if c.job == "prune":
        lengths.append(("calibration.seq_len", getattr(c.calibration, "seq_len", None)))
        if c.healing.name != "none":
            lengths.append(("healing.context_length", c.healing.context_length))
    for key, value in lengths:
        if isinstance(value, int) and value > shape.max_positions:
            reason = f"is beyond the {shape.max_positions} positions of model={c.model.name} (max_position_embeddings)"
            raise ConfigError(key, value, reason)


def check_calibration_tokens(c: schema.JobConfig, shape: ModelShape) -> None:
    """An unregularised fit of a hidden x hidden T (``width_determined``) from fewer calibration tokens
    than the model is wide, refused from the config alone: the tokens are at most ``n_samples x
    seq_len`` per pass (plus ``mask_passes`` masked copies), the width is the config's ``hidden_size``.
    The fit refuses it too (``ridge_solve``), but only after the load and the capture."""
    n_samples, seq_len = getattr(c.calibration, "n_samples", None), getattr(c.calibration, "seq_len", None)
    width = shape.hidden_size
    if c.alpha or not all(isinstance(v, int) for v in (n_samples, seq_len, width)):
        return
    if c.structure.name not in estimator_class(c.objective).requirements(c.objective).width_determined:
        return
    passes = 1 + (c.mask_passes if c.mask_ratio else 0)
    if n_samples * seq_len * passes < width:
        raise ConfigError(
            "calibration",
            f"{n_samples} samples x {seq_len} tokens" + (f" x {passes} passes" if passes > 1 else ""),
            f"at most {n_samples * seq_len * passes} tokens: too few to determine a {width}x{width} transform; at "
            f"least {width} are needed (raise calibration.n_samples or calibration.seq_len), or set alpha>0 (ridge)",
        )


def check_fusable(c: schema.JobConfig, shape: ModelShape) -> None:
    """A pruning job that fuses T into the down-projection (``lt_placement=fused`` with an objective
    that fits T, or a selection that ranks cuts by the LS residual in that placement) on a family
    with a norm after it (OLMo 2, Gemma 2, Gemma 3: ``shape.unfusable_reason``) is refused here, as
    its adapter would refuse it after the load."""
    if shape.unfusable_reason is None or c.lt_placement != "fused":
        return
    fits_transform = estimator_class(c.objective).requirements(c.objective).fits_transform
    selects_by_ls = c.cuts is None and METRICS.get(c.selection.metric).uses_statistics
    if fits_transform or selects_by_ls:
        raise unfusable_error(shape.unfusable_reason)


def check_checkpoint(key: str, value) -> None:
    """``value`` names a model directory: ``config.json`` and weights (``*.safetensors`` / ``*.bin``)."""
    path = Path(str(value)).expanduser()
    if not path.exists():
        raise ConfigError(key, value, "no such checkpoint directory")
    if not path.is_dir():
        raise ConfigError(key, value, "is a file, not a checkpoint directory")
    if not (path / "config.json").is_file():
        raise ConfigError(key, value, "is not a model directory (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ConfigError(key, value, "is not a model directory (no *.safetensors or *.bin weights)")


def check_evaluation(c: schema.JobConfig) -> None:
    """The rules of an evaluate job (``job=evaluate``; ``c.model`` is the evaluated model, the
    checkpoint already checked by :func:`check_checkpoint`): only what it reads, the eval suite.
    Calibration, selection, method and healing keys do not act and are not checked."""
    writable_directory("results_dir", c.results_dir, results_subfolders(c))
    writable_directory("cache_dir", c.cache_dir)
    check_embedded(c.model)
    check_suite(c.eval)
    MODALITIES.get(modality_of(c.model)).check_eval(c)
    if (ranks := ranks_from_env()) is not None:
        raise ConfigError("job", "evaluate", f"has no capture to split over {ranks.world_size} ranks: run one process")


def check_selection(c: schema.JobConfig, needs: Requirements) -> None:
    metric = METRICS.get(c.selection.metric)
    metric.check(c.selection)
    if metric.searches and c.cuts is None:
        check_search(c, metric, needs)
    seq_len = getattr(c.calibration, "seq_len", None)
    if c.estimation.tokens == "skip_first" and seq_len is not None and c.estimation.first >= seq_len:
        raise ConfigError(
            "estimation.first", c.estimation.first, f"leaves no token of sequences of calibration.seq_len={seq_len}"
        )


def check_search(c: schema.JobConfig, metric, needs: Requirements) -> None:
    """A selection by search removes (or merges) blocks itself: one set of removed blocks (``num_lts``
    does not act), run on the model in its own dtype; nothing fitted, except a transform from the LS
    statistics over each run of removed blocks after a search that only removes them
    (``fits_after``), fused into the block before it."""
    name = metric.name
    if (needs.fits_transform or needs.fits) and not metric.fits_after:
        reason = f"selection.metric={name} removes the blocks it finds, nothing is fitted: use objective=identity"
        raise ConfigError("objective", c.objective.name, reason)
    if needs.fits and (needs.tokens or needs.replacement is not None):
        reason = (
            f"after selection.metric={name} a transform is fitted from the LS statistics alone "
            "(a closed form from them, such as objective=ls)"
        )
        raise ConfigError("objective", c.objective.name, reason)
    if c.num_lts != 1:
        raise ConfigError(
            "num_lts", c.num_lts, f"selection.metric={name} decides the removed blocks itself (drop num_lts)"
        )
    if c.model.capture_4bit:
        raise ConfigError("model.capture_4bit", True, f"not with selection.metric={name} (it runs the model it prunes)")


def check_method(c: schema.JobConfig, needs: Requirements) -> None:
    """The estimator's own settings (:meth:`Requirements.check`), each method's rules, and healing with
    what the estimator fits."""
    name = c.objective.name
    needs.check(c)
    for method in job_methods(c):
        if method.check is not None:
            method.check(c, needs)
    if c.healing.name == "lt_only" and not needs.fits_transform:
        reason = f"trains the linear transform; objective={name} fits none (heal with lora or full_model)"
        raise ConfigError("healing", c.healing.name, reason)
    if c.healing.name != "none" and c.healing.data.source == "text_file":
        existing_file("healing.data.path", c.healing.data.path)
    check_suite(c.eval)


def check_official_settings(c: schema.JobConfig, needs: Requirements) -> None:
    """The official code's settings (``protocol=official`` sets them; each may be set alone) where
    they cannot act as it does."""
    if c.estimation.padded_positions and needs.fits:
        key = "estimation.padded_positions"
        if c.estimation.tokens != "all":
            reason = f"adds every padded position to the fit, which estimation.tokens={c.estimation.tokens} does not"
            raise ConfigError(key, True, reason + " (it picks tokens by their sequence); use estimation=all")
        if getattr(c.calibration, "padding_side", "right") != "right":
            reason = "needs calibration.padding_side=right (the official batches: padding after each sequence)"
            raise ConfigError(key, True, reason)
        if float(c.mask_ratio):
            raise ConfigError(key, True, "not with mask_ratio > 0 (masked copies carry their own positions)")
    if c.model.capture_dtype is not None and c.model.capture_4bit:
        raise ConfigError("model.capture_dtype", c.model.capture_dtype, "not with model.capture_4bit (a 4-bit copy)")
    several = len(c.cuts) > 1 if c.cuts is not None else c.num_lts != 1
    if several and not c.merge_consecutive and c.touching_cuts == "compose" and c.healing.name == "lt_only":
        reason = "not with healing=lt_only (two touching cuts' transforms share one down-projection)"
        raise ConfigError("touching_cuts", "compose", reason)


def check_data(c: schema.JobConfig, modality: str) -> None:
    """The calibration data, before the model loads: its source's own settings (its files can be opened)
    and a source of the job's ``modality``."""
    cal = c.calibration
    source = CALIBRATION_SOURCES.get(cal.source)
    source.settings(cal, "calibration")
    if source.modality != modality:
        if modality == "vision":
            images = ", ".join(name for name, s in CALIBRATION_SOURCES.items() if s.modality == "vision")
            reason = f"model={c.model.name} is a vision encoder: calibrate it on images ({images})"
        else:
            reason = f"is image data for vision encoders, not model={c.model.name}"
        raise ConfigError("calibration.source", cal.source, reason)


def check_hardware(c: schema.JobConfig) -> None:
    """What the machine must have (a GPU for a cuda device; bitsandbytes and a GPU for a 4-bit
    capture) and what a 4-bit capture cannot be combined with."""
    for key, device in (("model.device", c.model.device), ("capture.device", c.capture.device)):
        if isinstance(device, str) and device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(key, device, "this machine has no CUDA GPU (use auto or cpu)")
    if not c.model.capture_4bit:
        return
    if c.capture.mode == "layerwise":
        raise ConfigError(
            "capture.mode", "layerwise", "not with model.capture_4bit (a 4-bit copy is placed on the GPU)"
        )
    if c.calibration.source == "generated":
        reason = "not with model.capture_4bit (the answers would come from the 4-bit copy)"
        raise ConfigError("calibration.source", c.calibration.source, reason)
    check_nf4_capture(c.model)


# What to heal on instead of a hub dataset that cannot be read here.
LOCAL_HEALING_TEXT = "heal on local text (healing/data=pydoc or healing/data=text_file)"


def check_inputs(c: schema.JobConfig) -> None:
    """What the job ``c`` will read, before its model loads: the contents of the user's files
    (:func:`check_input_files`) and the hub datasets it needs, in the local cache or, online, on a
    reachable hub (:func:`~replaceme_exp.data.hub.require_available`). Files are read (their first
    :data:`~replaceme_exp.data.files.PREFLIGHT_BYTES`) and the hub may be asked: run once per job."""
    check_input_files(c)
    require_available(hub_datasets(c))


def heldout_image_set(c: schema.JobConfig):
    """The image set of ``eval.heldout_images`` as a calibration option (None: none)."""
    images = getattr(c.eval, "heldout_images", None)
    if not images:
        return None
    return build_option("calibration", {"name": "heldout_images", **images}, "eval.heldout_images")


def check_input_files(c: schema.JobConfig) -> None:
    """The user's files the job reads, each source by its own ``check`` (calibration text, JSON
    records, prompts, image headers) and the held-out and healing text: one line naming the key,
    the file and (JSON lines) the line of the first problem."""
    if c.job == "prune":
        source = CALIBRATION_SOURCES.get(c.calibration.source)
        source.check(c.calibration, "calibration", int(c.calibration.n_samples))
        if c.healing.name != "none" and c.healing.data.source == "text_file":
            check_text("healing.data.path", c.healing.data.path)
    if modality_of(c.model) == "text" and c.eval.text == "text_file":
        check_text("eval.path", c.eval.path)
    if (images := heldout_image_set(c)) is not None:
        CALIBRATION_SOURCES.get(images.source).check(images, "eval.heldout_images", None)


def hub_datasets(c: schema.JobConfig) -> list[HubDataset]:
    """The hub datasets the job ``c`` reads: its calibration source's, the healing text's, the lm-eval
    suite's tasks', the image benchmarks' (each named by the key that asks for it)."""
    out: list[HubDataset] = []
    if c.job == "prune":
        out += CALIBRATION_SOURCES.get(c.calibration.source).hub_datasets(c.calibration, "calibration")
        data = c.healing.data
        if c.healing.name != "none" and isinstance(data, schema.DatasetHealingDataConfig):
            key = "healing.data.dataset"
            out.append(HubDataset(key, data.dataset, data.dataset, data.subset, instead=LOCAL_HEALING_TEXT))
    if c.eval.harness is not None:
        out += suite_datasets(c.eval.harness)
    if isinstance(c.eval, schema.ImageEvalConfig):
        out += benchmark_datasets(list(c.eval.benchmarks))
        if (images := heldout_image_set(c)) is not None:
            out += CALIBRATION_SOURCES.get(images.source).hub_datasets(images, "eval.heldout_images")
    return out
