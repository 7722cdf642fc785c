"""Healing: fine-tune the pruned model with the language-modelling loss, then leave a plain model.

``healing.name``:

- ``lt_only``: only the linear transform(s) train (the paper's "Only LT" row: one hidden x hidden
  matrix per cut, 16.8M parameters for Llama 2 7B), starting from the estimated T. With the fused
  placement the fusion target gets its original weights back inside a :class:`TransformedLinear`
  (``base(x) @ T``), so T itself is the parameter, and T is fused again after training; with the
  separate placement the transform of the block-output hook becomes the parameter.
- ``full_model``: every weight trains (the paper's "Full model" row).
- ``lora``: LoRA adapters (peft) on ``healing.lora.target_modules`` (``mlp``: the MLP projections by
  default: UIDL's healing as the paper ran it), merged into the weights after training.

Low-precision (bfloat16 / float16) trainable weights train through float32 master weights
(``healing.master_weights=float32``, the default): Adam updates a float32 copy and the model gets
it rounded after every step, so updates below the weights' resolution accumulate instead of being
lost (with lr 1e-5 and a bf16 weight of 0.02, whose spacing is 1.2e-4, plain Adam on the bf16
weight does not move it at all). ``model`` trains the model's own parameters (before 2026-11-24).
The separate placement's trainable T is float32 likewise; the fused placement's always was.

``healing.loss``: ``lm`` (next-token NLL, the default) or ``topk_kl`` (LinearPatch's distillation:
the KL to the unpruned model's top-k next-token distribution of each window, taken before surgery,
:func:`teacher_targets`).

Training is a plain loop: Adam (or AdamW; a constant or cosine learning rate), ``batch_size``
windows of ``context_length`` tokens per micro-step,
``gradient_accumulation_steps`` micro-steps per optimizer step, ``max_steps`` steps, cycling over
the windows (reshuffled each epoch by ``seed``). Every mode ends as a model with the pruned
architecture and no extra module, so it saves as a standard checkpoint.
"""

from __future__ import annotations

import logging
import random
import time
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from replaceme_exp.config.schema import HealingConfig
from replaceme_exp.data.batching import TokenBatch, TokenBatches, pack_windows
from replaceme_exp.data.calibration import healing_documents
from replaceme_exp.errors import ConfigError
from replaceme_exp.models.adapters import DecoderAdapter
from replaceme_exp.progress import progress_counter
from replaceme_exp.surgery import attach_separate_transforms, fuse_transform

log = logging.getLogger(__name__)

Cut = tuple[int, int]
HEALING_MODES = ("lt_only", "full_model", "lora")
# Each mode as the row's ``method`` names it after the method (" + LoRA healing").
HEALING_LABELS = {"lt_only": "LT healing", "full_model": "full healing", "lora": "LoRA healing"}
LOW_PRECISION = (torch.bfloat16, torch.float16)


class MasterWeights:
    """What the optimiser updates: a float32 copy of each low-precision parameter (the parameter
    itself for float32 ones, or for all with ``enabled=False``). After the backward pass,
    :meth:`take_gradients` moves each parameter's gradient to its copy (as float32); after the step,
    :meth:`write_back` rounds the copies into the parameters."""

    def __init__(self, parameters: list[nn.Parameter], enabled: bool = True):
        self.pairs = [
            (p, p.detach().float().clone().requires_grad_(True) if enabled and p.dtype in LOW_PRECISION else p)
            for p in parameters
        ]

    @property
    def optimised(self) -> list[torch.Tensor]:
        return [master for _, master in self.pairs]

    @property
    def copies(self) -> int:
        """How many parameters have a float32 copy."""
        return sum(master is not p for p, master in self.pairs)

    def take_gradients(self) -> None:
        for p, master in self.pairs:
            if master is not p:
                master.grad = None if p.grad is None else p.grad.float()
                p.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        for p, master in self.pairs:
            if master is not p:
                p.copy_(master)


class TransformedLinear(nn.Module):
    """``base(x) @ T`` for ``x`` (..., in_features) -> (..., out_features): a frozen linear layer
    followed by a trainable (out_features, out_features) transform ``T``, kept in float32 and cast
    to the activations' dtype in the product."""

    def __init__(self, base: nn.Linear, transform: torch.Tensor):
        super().__init__()
        self.base = base
        self.transform = nn.Parameter(transform.detach().to(device=base.weight.device, dtype=torch.float32).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        return out @ self.transform.to(out.dtype)


def fusion_weights(adapter: DecoderAdapter, cuts: list[Cut]) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
    """Copies (on the CPU) of the unfused weight and bias of each cut's fusion target (block
    ``start - 1``, original index), taken before surgery: ``lt_only`` trains T against them."""
    out = {}
    for start, _ in cuts:
        linear = adapter.fusion_target(start - 1)
        bias = linear.bias.detach().cpu().clone() if linear.bias is not None else None
        out[start - 1] = (linear.weight.detach().cpu().clone(), bias)
    return out


def _set_module(root: nn.Module, module: nn.Module, new: nn.Module) -> None:
    for child in root.modules():
        for attr, sub in child.named_children():
            if sub is module:
                setattr(child, attr, new)
                return
    raise ValueError("module not found in the model")


@dataclass
class TrainableTransforms:
    """The transforms that ``lt_only`` trains: by block index of the pruned model, the parameter
    and, for the fused placement, the wrapper that holds it."""

    placement: str
    parameters: dict[int, nn.Parameter]
    wrappers: dict[int, TransformedLinear]
    cuts: dict[int, Cut]
    initial: dict[int, torch.Tensor]


@torch.no_grad()
def attach_trainable_transforms(
    adapter: DecoderAdapter,
    transforms: dict[Cut, torch.Tensor | None],
    kept: list[int],
    originals: dict[int, tuple[torch.Tensor, torch.Tensor | None]],
    placement: str = "fused",
    float32: bool = True,
) -> TrainableTransforms:
    """Make each cut's T a parameter of the pruned model (``kept``: original indices of its blocks)
    without changing what it computes. Fused: the fusion target (which holds ``T^T W`` after
    surgery) gets ``originals[start - 1]`` back and is wrapped in a :class:`TransformedLinear`
    (T in float32). Separate: the hook of block ``start - 1`` multiplies by the parameter, in
    float32 (cast to the activations' dtype in the product), or with ``float32=False`` in the
    block's dtype."""
    parameters, wrappers, cuts, initial = {}, {}, {}, {}
    for (start, end), transform in sorted(transforms.items()):
        if transform is None:
            continue
        index = kept.index(start - 1)
        cuts[index], initial[index] = (start, end), transform.detach().float().cpu().clone()
        if placement == "fused":
            linear = adapter.fusion_target(index)
            weight, bias = originals[start - 1]
            linear.weight.copy_(weight.to(linear.weight.device, linear.weight.dtype))
            if bias is not None:
                linear.bias.copy_(bias.to(linear.bias.device, linear.bias.dtype))
            wrapper = TransformedLinear(linear, transform)
            _set_module(adapter.model, linear, wrapper)
            wrappers[index], parameters[index] = wrapper, wrapper.transform
        else:
            block = adapter.layers[index]
            first = next(block.parameters())
            dtype = torch.float32 if float32 else first.dtype
            parameters[index] = nn.Parameter(transform.detach().to(first.device, dtype).clone())
    if placement == "separate":
        attach_separate_transforms(adapter, parameters)  # the hooks multiply by the parameters themselves
    return TrainableTransforms(placement, parameters, wrappers, cuts, initial)


@torch.no_grad()
def fuse_trained_transforms(adapter: DecoderAdapter, trainable: TrainableTransforms) -> dict[str, float]:
    """Undo :func:`attach_trainable_transforms` with the trained values: each wrapper is replaced
    by its base layer with T fused in (``T^T W``, ``T^T b``), or each hook gets the trained T as a
    plain tensor. Returns how far each T moved, ``||T - T0||_F / ||T0||_F``, by cut ``"start-end"``."""
    change = {}
    for index, parameter in trainable.parameters.items():
        start, end = trainable.cuts[index]
        before = trainable.initial[index]
        change[f"{start}-{end}"] = float((parameter.detach().float().cpu() - before).norm() / before.norm())
    if trainable.placement == "fused":
        for index, wrapper in trainable.wrappers.items():
            _set_module(adapter.model, wrapper, wrapper.base)
            fuse_transform(adapter, index, wrapper.transform.detach())
    else:
        attach_separate_transforms(adapter, {i: p.detach().clone() for i, p in trainable.parameters.items()})
    return change


@dataclass
class HealingResult:
    """What a healing run did: optimizer ``steps``, ``epochs`` over the windows (fractional),
    ``tokens`` trained on, ``trainable_params``, ``seconds`` of training, ``loss_first`` /
    ``loss_last`` (mean LM loss over the first and last ``log_every`` steps) and the loss every
    ``log_every`` steps (``loss_curve``: [step, mean loss] pairs); for ``lt_only`` how far each T
    moved (``transform_change``, see :func:`fuse_trained_transforms`)."""

    mode: str
    steps: int
    epochs: float
    tokens: int
    trainable_params: int
    seconds: float
    loss_first: float
    loss_last: float
    loss_curve: list
    transform_change: dict | None = None

    def columns(self) -> dict:
        out = {f"healing_{k}": v for k, v in asdict(self).items() if k != "mode"}
        out["healing_seconds_per_step"] = self.seconds / self.steps if self.steps else None
        return out


def healing_windows(cfg: HealingConfig, tokenizer) -> TokenBatches:
    """The training windows: ``healing.data``'s documents packed into full windows of
    ``healing.context_length`` tokens (BOS-prefixed when the tokenizer has one), one per batch row,
    at most as many as ``max_steps`` would use."""
    context = int(cfg.context_length)
    per_step = int(cfg.batch_size) * int(cfg.gradient_accumulation_steps)
    needed = int(cfg.max_steps) * per_step
    documents = healing_documents(cfg.data, tokenizer, context, int(cfg.seed))
    windows = pack_windows(documents, tokenizer, context, needed, int(cfg.batch_size))
    if len(windows) == 0:
        raise ConfigError("healing.data", cfg.data.name, f"holds less text than one window of {context} tokens")
    if windows.n_sequences < per_step:
        raise ConfigError(
            "healing.batch_size",
            cfg.batch_size,
            f"x gradient_accumulation_steps={cfg.gradient_accumulation_steps} needs {per_step} windows per step; "
            f"the healing data gives {windows.n_sequences} of {context} tokens",
        )
    return windows


def _micro_batches(windows: TokenBatches, seed: int):
    """Endless windows' batches, reshuffled each epoch; yields (epoch, index, batch)."""
    order = list(range(len(windows.batches)))
    epoch = 0
    while True:
        random.Random(seed + epoch).shuffle(order)
        for i in order:
            yield epoch, i, windows.batches[i]
        epoch += 1


@dataclass
class TeacherTargets:
    """The unpruned model's top-k next-token distribution on each healing batch (``loss=topk_kl``,
    LinearPatch's offline distillation data): per batch, ``probs`` (batch, seq, k) float16, the
    softmax over the top-k logits alone, and ``indices`` (batch, seq, k) int32, their token ids."""

    probs: list[torch.Tensor]
    indices: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        tensors = [*self.probs, *self.indices]
        return sum(t.numel() * t.element_size() for t in tensors)


@torch.no_grad()
def teacher_targets(model, windows: TokenBatches, topk: int) -> TeacherTargets:
    """:class:`TeacherTargets` of ``model`` (the unpruned model, before surgery) on ``windows``:
    ``softmax(topk(logits))`` at every position, as the official ``get_offline_dataset`` stores them
    (float16 probabilities)."""
    device = model.get_input_embeddings().weight.device
    probs, indices = [], []
    for batch in windows.batches:
        logits = model(
            input_ids=batch.input_ids.to(device), attention_mask=batch.attention_mask.to(device), use_cache=False
        ).logits
        top, index = torch.topk(logits.float(), int(topk), dim=-1)
        probs.append(torch.softmax(top, dim=-1).half().cpu())
        indices.append(index.to(torch.int32).cpu())
    return TeacherTargets(probs, indices)


def topk_kl_loss(logits: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the non-padding positions of ``KL(t || softmax(s))`` on the teacher's top-k tokens:
    ``t`` = ``probs`` (batch, seq, k), ``s`` = the student's ``logits`` (batch, seq, vocab) gathered at
    ``indices`` and renormalised over those k (LinearPatch's ``output_kl``: ``KLDivLoss(batchmean)``
    of a single 2048-token window divided by its length)."""
    student = torch.log_softmax(logits.float().gather(-1, indices.long().to(logits.device)), dim=-1)
    target = probs.to(logits.device, torch.float32)
    per_token = (torch.xlogy(target, target) - target * student).sum(-1)
    weight = mask.to(per_token.device, per_token.dtype)
    return (per_token * weight).sum() / weight.sum().clamp(min=1)


def set_activation_checkpointing(model, enabled: bool) -> None:
    """Recompute each block's activations in the backward pass (non-reentrant, so frozen inputs
    need no gradient): transformers' ``activation_checkpointing_*`` (v5) or the older
    ``gradient_checkpointing_*`` names; a peft wrapper passes the call to its base model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if enabled:
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(base, "activation_checkpointing_disable"):
        base.activation_checkpointing_disable()
    else:
        base.gradient_checkpointing_disable()


def _lm_loss(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean next-token NLL over the predicted non-padding positions (the first is context) and
    how many positions that is."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    targets = input_ids[:, 1:].masked_fill(attention_mask[:, 1:] == 0, -100).to(logits.device)
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
    return loss, int((targets != -100).sum())


def make_optimizer(parameters: list[torch.Tensor], cfg: HealingConfig):
    """``healing.optimizer`` (Adam, or AdamW with decoupled weight decay) and its learning-rate
    scheduler (None for ``lr_schedule=constant``; ``cosine``: annealed over ``max_steps`` steps to
    ``lr / min_lr_factor``, stepped once per optimiser step, as LinearPatch's distillation)."""
    kind = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = kind(parameters, lr=float(cfg.lr), betas=tuple(cfg.betas), weight_decay=float(cfg.weight_decay))
    scheduler = None
    if cfg.lr_schedule == "cosine":
        eta_min = float(cfg.lr) / float(cfg.min_lr_factor)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=int(cfg.max_steps), eta_min=eta_min)
    return optimizer, scheduler


def micro_batch_loss(model, batch: TokenBatch, index: int, targets: TeacherTargets | None) -> tuple[torch.Tensor, int]:
    """The loss of one micro-batch (a scalar) and how many positions it counts: the LM loss, or with
    ``targets`` the KL to the teacher's top-k distribution of batch ``index`` (:func:`topk_kl_loss`)."""
    device = model.get_input_embeddings().weight.device
    input_ids, attention_mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    if targets is None:
        return _lm_loss(model, input_ids, attention_mask)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    loss = topk_kl_loss(logits, targets.probs[index], targets.indices[index], attention_mask)
    return loss, int(attention_mask.sum())


def accumulate_gradients(
    model, batches, cfg: HealingConfig, step: int, targets: TeacherTargets | None
) -> tuple[float, int, int]:
    """The backward passes of optimizer step ``step``: ``gradient_accumulation_steps`` micro-batches of
    ``batches`` (:func:`_micro_batches`). Returns their mean loss, positions counted and windows."""
    accumulate = int(cfg.gradient_accumulation_steps)
    step_loss, tokens, sequences = 0.0, 0, 0
    for _ in range(accumulate):
        _, index, batch = next(batches)
        loss, n = micro_batch_loss(model, batch, index, targets)
        if not torch.isfinite(loss):
            reason = f"the {cfg.loss} loss became {float(loss)} at step {step}"
            raise ConfigError("healing.lr", cfg.lr, reason)
        (loss / accumulate).backward()
        step_loss += float(loss.detach()) / accumulate
        tokens += n
        sequences += batch.input_ids.shape[0]
    return step_loss, tokens, sequences


def optimizer_step(masters: MasterWeights, optimizer, scheduler, max_grad_norm: float | None) -> None:
    """Update the master weights from the accumulated gradients (clipped to ``max_grad_norm`` when
    set) and round them into the model's; the learning-rate schedule moves on."""
    masters.take_gradients()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(masters.optimised, float(max_grad_norm))
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    masters.write_back()


@dataclass
class LossCurve:
    """``points``: [step, mean step loss] every ``log_every`` steps and at the last of ``steps``."""

    log_every: int
    steps: int
    points: list[list] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)  # the step losses since the last point

    def add(self, step: int, loss: float) -> None:
        self.pending.append(loss)
        if step % self.log_every == 0 or step == self.steps:
            self.points.append([step, sum(self.pending) / len(self.pending)])
            log.info("healing step %d/%d: loss %.4f", step, self.steps, self.points[-1][1])
            self.pending = []


@contextmanager
def training_only(model, parameters: list[nn.Parameter], checkpointing: bool) -> Iterator[None]:
    """Within the block, ``model`` in training mode with gradients for ``parameters`` alone (and
    activation checkpointing with ``checkpointing``); after it, as before, without their gradients."""
    trainable = {id(p) for p in parameters}
    frozen = [p for p in model.parameters() if id(p) not in trainable and p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    for p in parameters:
        p.requires_grad_(True)
    if checkpointing:
        set_activation_checkpointing(model, True)
    was_training = model.training
    model.train()
    try:
        yield
    finally:
        for p in parameters:
            p.grad = None
        if checkpointing:
            set_activation_checkpointing(model, False)
        model.train(was_training)
        for p in parameters:
            p.requires_grad_(False)
        for p in frozen:
            p.requires_grad_(True)


def train_language_model(
    model,
    parameters: list[nn.Parameter],
    windows: TokenBatches,
    cfg: HealingConfig,
    mode: str,
    targets: TeacherTargets | None = None,
):
    """``healing.optimizer`` on ``parameters`` (everything else frozen) for ``cfg.max_steps`` steps,
    with the LM loss or (``targets``: ``loss=topk_kl``) the KL to the teacher's top-k distribution of
    each window. Returns a :class:`HealingResult`."""
    steps, tokens, sequences = int(cfg.max_steps), 0, 0
    with training_only(model, parameters, bool(cfg.gradient_checkpointing)):
        masters = MasterWeights(parameters, enabled=cfg.master_weights == "float32")
        optimizer, scheduler = make_optimizer(masters.optimised, cfg)
        batches, curve = _micro_batches(windows, int(cfg.seed)), LossCurve(int(cfg.log_every), steps)
        started = time.perf_counter()
        try:
            with progress_counter(steps, desc=f"healing ({mode})", unit="step") as counter:
                for step in range(1, steps + 1):
                    optimizer.zero_grad(set_to_none=True)
                    step_loss, n_tokens, n_sequences = accumulate_gradients(model, batches, cfg, step, targets)
                    tokens, sequences = tokens + n_tokens, sequences + n_sequences
                    optimizer_step(masters, optimizer, scheduler, cfg.max_grad_norm)
                    curve.add(step, step_loss)
                    counter.update(1)
        finally:
            optimizer.zero_grad(set_to_none=True)
    return HealingResult(
        mode=mode,
        steps=steps,
        epochs=sequences / max(windows.n_sequences, 1),
        tokens=tokens,
        trainable_params=sum(p.numel() for p in parameters),
        seconds=time.perf_counter() - started,
        loss_first=curve.points[0][1],
        loss_last=curve.points[-1][1],
        loss_curve=curve.points,
    )


def lora_config(cfg: HealingConfig, adapter: DecoderAdapter):
    """peft's ``LoraConfig`` from ``healing.lora`` (r, alpha, dropout, target_modules: a list of
    linear layer names, or ``mlp`` for the family's MLP projections,
    :attr:`DecoderAdapter.mlp_projection_names`)."""
    from peft import LoraConfig

    lora = cfg.lora
    if lora.target_modules == "mlp":
        targets = list(adapter.mlp_projection_names)
    else:
        targets = list(lora.target_modules) if isinstance(lora.target_modules, list) else None
    if not targets:
        raise ConfigError("healing.lora.target_modules", lora.target_modules, "give mlp or a list of module names")
    return LoraConfig(
        r=int(lora.r),
        lora_alpha=float(lora.alpha),
        lora_dropout=float(lora.dropout),
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def heal(
    adapter: DecoderAdapter,
    windows: TokenBatches,
    cfg: HealingConfig,
    trainable: TrainableTransforms | None = None,
    targets: TeacherTargets | None = None,
) -> HealingResult:
    """Fine-tune ``adapter.model`` in place according to ``cfg`` (the ``healing`` group) on
    ``windows``; ``trainable``: the transforms that ``lt_only`` trains
    (:func:`attach_trainable_transforms`); ``targets``: the unpruned model's top-k distributions on
    ``windows`` (``loss=topk_kl``, :func:`teacher_targets`). The model ends with the pruned
    architecture and no extra module. Returns what the training did."""
    mode = cfg.name
    model = adapter.model
    if cfg.loss == "topk_kl" and targets is None:
        raise ConfigError("healing.loss", cfg.loss, "needs the unpruned model's top-k targets, taken before surgery")
    if mode == "lt_only":
        if trainable is None or not trainable.parameters:
            raise ConfigError("healing", mode, "the job has no transform to train")
        result = train_language_model(model, list(trainable.parameters.values()), windows, cfg, mode, targets)
        result.transform_change = fuse_trained_transforms(adapter, trainable)
        return result
    if mode == "full_model":
        parameters = [p for p in model.parameters() if p.is_floating_point()]
        return train_language_model(model, parameters, windows, cfg, mode, targets)
    if mode == "lora":
        return heal_with_lora(adapter, windows, cfg, targets)
    raise ConfigError("healing.name", mode, f"choose none or one of {HEALING_MODES}")


def with_lora_adapters(adapter: DecoderAdapter, cfg: HealingConfig):
    """``adapter.model`` wrapped by peft with ``cfg``'s LoRA adapters (float32 on a bf16 / fp16
    model: peft's ``autocast_adapter_dtype``)."""
    from peft import get_peft_model

    config = lora_config(cfg, adapter)
    names = {name.rsplit(".", 1)[-1] for name, m in adapter.model.named_modules() if isinstance(m, nn.Linear)}
    if missing := sorted(set(config.target_modules) - names):
        key, value = "healing.lora.target_modules", sorted(config.target_modules)
        raise ConfigError(key, value, f"no linear layer named {missing}")
    with warnings.catch_warnings():  # peft asks transformers v5 with a name it deprecates
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(adapter.model, config, autocast_adapter_dtype=True)


def heal_with_lora(
    adapter: DecoderAdapter, windows: TokenBatches, cfg: HealingConfig, targets: TeacherTargets | None = None
) -> HealingResult:
    """LoRA adapters from peft on the configured modules of ``adapter.model``, trained, then merged
    into the base weights (``merge_and_unload``): the model object keeps its modules, now with
    ``W + B A * alpha / r`` in the targeted linears."""
    model = adapter.model
    peft_model = with_lora_adapters(adapter, cfg)
    parameters = [p for p in peft_model.parameters() if p.requires_grad]
    result = train_language_model(peft_model, parameters, windows, cfg, "lora", targets)
    merged = peft_model.merge_and_unload()
    if merged is not model:  # merge_and_unload returns the base model object, modified in place
        raise RuntimeError("peft returned another model object after merging")
    return result
