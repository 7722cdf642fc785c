"""LLM-Streamline's layer replacement (Chen et al., ICLR 2025; official code RUCKBReasoning/LLM-Streamline):
the selected cut is replaced by a lightweight network trained with MSE to map the cut's input hidden
states to its output hidden states on the calibration sequences.

- ``replacement="ffn"``: a new :class:`~replaceme_exp.models.replacement.ReplacementFFN` (no
  residual; ``ffn_init="normal"``: weights from N(0, the model's ``initializer_range``) and zero
  biases, as the authors' model class initialises it) maps ``L_{start-1}`` to ``L_{end-1}``; the
  cut's blocks are removed and the FFN runs after block ``start-1`` (not a plain checkpoint).
- ``replacement="layer"``: the cut's first block, initialised with its own weights (the official
  code's ``init_layer``), is trained to map the cut's input to its output; it stays with the new
  weights and the cut's other blocks go (a plain checkpoint). Its cut spans one block more than it
  removes, as in the official code (``layer_intervals + 1`` hidden states apart).

Training follows the official loops: AdamW, micro-batches of ``batch_size`` sequences (shuffled,
seeded), the loss divided by ``grad_accumulation``, an optimizer step every ``grad_accumulation``
micro-batches (and one on an epoch's remainder), optional gradient clipping, and the official
cosine schedule with linear warm-up to ``min_lr`` (:func:`streamline_lr_factor`). The loss is the
mean squared error over the non-padding tokens and hidden features.
"""

from __future__ import annotations

import copy
import inspect
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.capture.hooks import backbone_forward, input_device
from replaceme_exp.data.batching import TokenBatches, position_ids_for
from replaceme_exp.estimation.estimators import Estimator, Requirements
from replaceme_exp.models.replacement import ReplacementFFN
from replaceme_exp.progress import progress
from replaceme_exp.stages import stage

Cut = tuple[int, int]

# Fewer optimizer steps than this (or none at a learning rate above 0) leave the network as it was
# built, for the row's ``untrained`` column: the authors train for thousands of steps.
MIN_TRAINED_STEPS = 10
# The authors' model class draws its weights from N(0, initializer_range) (LlamaPreTrainedModel); a
# config without one gets transformers' usual value.
DEFAULT_INITIALIZER_RANGE = 0.02


class SequenceStore:
    """The cut's input and output hidden states of each calibration sequence, its non-padding
    tokens only: ``x``, ``y`` (tokens, hidden) float32 and ``positions`` (tokens,) int64, in host
    memory or (``location="disk"``) one file per sequence under a temporary directory."""

    def __init__(self, location: str = "cpu", directory: str | None = None):
        self.location = "disk" if location == "disk" else "cpu"
        self._tmpdir = tempfile.TemporaryDirectory(prefix="streamline-", dir=directory) if location == "disk" else None
        self._items: list = []
        self.n_tokens = 0

    def put(self, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor) -> None:
        item = (x.detach().float().cpu(), y.detach().float().cpu(), positions.detach().long().cpu())
        self.n_tokens += int(item[0].shape[0])
        if self._tmpdir is None:
            self._items.append(item)
            return
        path = Path(self._tmpdir.name) / f"sequence-{len(self._items)}.pt"
        torch.save(item, path)
        self._items.append(path)

    def get(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        item = self._items[index]
        return item if self._tmpdir is None else torch.load(item)

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        self._items.clear()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()


class _Stop(Exception):
    """Raised after the cut's last block: the rest of the model is not run."""


@torch.no_grad()
def capture_cut_states(adapter, batches: TokenBatches, cut: Cut, store: SequenceStore) -> None:
    """Run the model on ``batches`` up to block ``end - 1`` and put, per sequence, the input of
    block ``start`` (``L_{start-1}``) and the output of block ``end - 1`` (``L_{end-1}``) at its
    non-padding tokens, with their positions, into ``store``. Outside inference mode: the tensors
    feed a training loop."""
    start, end = cut
    caught: dict[str, torch.Tensor] = {}

    def before(module, args, kwargs):
        caught["x"] = args[0] if args else kwargs["hidden_states"]

    def after(module, args, output):
        caught["y"] = output[0] if isinstance(output, tuple) else output
        raise _Stop

    handles = [
        adapter.layers[start].register_forward_pre_hook(before, with_kwargs=True),
        adapter.layers[end - 1].register_forward_hook(after),
    ]
    try:
        for batch in progress(batches, desc="capture (cut states)", unit="batch"):
            try:
                backbone_forward(adapter, batch)
            except _Stop:
                pass
            mask = batch.attention_mask.bool()
            positions = batch.position_ids if batch.position_ids is not None else position_ids_for(batch.attention_mask)
            for i in range(mask.shape[0]):
                keep = mask[i].to(caught["x"].device)
                store.put(caught["x"][i][keep], caught["y"][i][keep], positions[i][mask[i]])
    finally:
        for handle in handles:
            handle.remove()


def streamline_lr_factor(step: int, warmup_steps: float, schedule_steps: float, max_lr: float, min_lr: float) -> float:
    """The official ``_get_cosine_schedule_with_warmup_lr_lambda`` (LLM_Streamline/scheduler.py):
    the learning rate over ``max_lr`` at scheduler step ``step``: linear from 0 over
    ``warmup_steps``, then ``min_lr + (max_lr - min_lr) * (1 + cos(pi * progress)) / 2`` with
    ``progress`` the fraction of ``schedule_steps`` after warm-up (not clipped at 1: the cosine turns
    back up past it, as in the official code)."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    progress_ = float(step - warmup_steps) / float(max(1, schedule_steps - warmup_steps))
    factor = max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress_)))
    return (min_lr + factor * (max_lr - min_lr)) / max_lr


def padded(items: list, hidden: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences ``[(x, y, positions), ...]`` right-padded to one length: ``x``, ``y`` (batch, seq,
    hidden), ``positions`` (batch, seq) and ``mask`` (batch, seq), 1 at real tokens."""
    length = max(item[0].shape[0] for item in items)
    x = torch.zeros(len(items), length, hidden)
    y = torch.zeros(len(items), length, hidden)
    positions = torch.zeros(len(items), length, dtype=torch.long)
    mask = torch.zeros(len(items), length, dtype=torch.long)
    for i, (xi, yi, pi) in enumerate(items):
        n = xi.shape[0]
        x[i, :n], y[i, :n], positions[i, :n], mask[i, :n] = xi, yi, pi, 1
        if n < length:  # padding continues the positions (masked out; kept increasing)
            positions[i, n:] = (int(pi[-1]) + 1 if n else 0) + torch.arange(length - n)
    return x, y, positions, mask


def masked_mse(prediction: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``(prediction - target)^2`` over the tokens where ``mask`` is 1 and every feature."""
    weight = mask.to(prediction.dtype).unsqueeze(-1)
    return ((prediction - target) ** 2 * weight).sum() / (weight.sum() * prediction.shape[-1])


class BlockRunner:
    """Runs one decoder block alone on padded sequences, with the attention mask and rotary
    embeddings its model would give it (the backbone's ``rotary_emb``; ``create_causal_mask``, or
    ``create_sliding_window_causal_mask`` for a block whose attention is ``sliding_attention``):
    the layer variant's forward. Families whose blocks take ``position_embeddings`` (Llama,
    Mistral, Qwen 2/3, Gemma 3, whose rotary embedding differs between its local and global layers
    and is asked for the block's own ``layer_type``)."""

    def __init__(self, adapter, block: torch.nn.Module):
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        self.block, self.config = block, adapter.config
        self.rotary = getattr(adapter.backbone, "rotary_emb", None)
        if self.rotary is None:
            family = self.config.model_type
            raise ValueError(f"LLM-Streamline's layer replacement needs a model with rotary embeddings, not {family}")
        # the block's attention kind, fixed when the block was built (its index in the unpruned model)
        layer_type = getattr(getattr(block, "self_attn", None), "layer_type", None)
        sliding = layer_type == "sliding_attention"
        self.create_mask = create_sliding_window_causal_mask if sliding else create_causal_mask
        per_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.rotary_kwargs = {"layer_type": layer_type} if per_type else {}

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` (batch, seq, hidden) with ``positions`` and ``mask`` (batch, seq) -> the block's
        output (batch, seq, hidden)."""
        rotary = self.rotary.to(x.device)
        embeddings = rotary(x, position_ids=positions, **self.rotary_kwargs)
        attention = self.create_mask(
            config=self.config, inputs_embeds=x, attention_mask=mask, past_key_values=None, position_ids=positions
        )
        out = self.block(x, attention_mask=attention, position_ids=positions, position_embeddings=embeddings)
        return out[0] if isinstance(out, tuple) else out


@dataclass
class TrainingRun:
    """What training did: ``loss_curve`` (the mean micro-batch loss of each optimizer step, before
    it), ``lr_curve`` (the learning rate each optimizer step used), ``loss_before`` / ``loss_after``
    (the MSE over every stored token, before and after), ``steps`` (optimizer steps),
    ``micro_batches`` (per epoch)."""

    loss_curve: list[float] = field(default_factory=list)
    lr_curve: list[float] = field(default_factory=list)
    loss_before: float | None = None
    loss_after: float | None = None
    steps: int = 0
    micro_batches: int = 0


def full_loss(forward, store: SequenceStore, batch_size: int, hidden: int, device) -> float:
    """The MSE over every token in ``store`` (token-weighted), in batches of ``batch_size`` sequences."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for lo in range(0, len(store), batch_size):
            chunk = [store.get(i) for i in range(lo, min(lo + batch_size, len(store)))]
            x, y, positions, mask = (t.to(device) for t in padded(chunk, hidden))
            n = int(mask.sum())
            total += float(masked_mse(forward(x, positions, mask), y, mask)) * n
            tokens += n
    return total / max(tokens, 1)


def train(
    network: torch.nn.Module, forward, store: SequenceStore, settings, seed: int, hidden: int, device
) -> TrainingRun:
    """Train ``network``'s parameters with ``forward(x, positions, mask) -> prediction`` to the
    stored outputs (see the module docstring); ``settings``: the objective config."""
    s = settings
    parameters = [p for p in network.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=s.lr, weight_decay=s.weight_decay, betas=tuple(s.betas))
    micro_batches = math.ceil(len(store) / s.batch_size)
    schedule = micro_batches * s.epochs * s.schedule_ratio
    warmup = schedule * s.warmup_ratio

    def factor(step: int) -> float:
        return streamline_lr_factor(step, warmup, schedule, s.lr, s.min_lr)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    generator = torch.Generator().manual_seed(seed)
    run = TrainingRun(micro_batches=micro_batches)
    network.eval()
    run.loss_before = full_loss(forward, store, s.batch_size, hidden, device)
    network.train()
    for _ in range(s.epochs):
        order = torch.randperm(len(store), generator=generator).tolist()
        optimizer.zero_grad()
        losses: list[float] = []
        for k in progress(range(micro_batches), desc="LLM-Streamline training", unit="batch"):
            chunk = [store.get(i) for i in order[k * s.batch_size : (k + 1) * s.batch_size]]
            x, y, positions, mask = (t.to(device) for t in padded(chunk, hidden))
            loss = masked_mse(forward(x, positions, mask), y, mask)
            (loss / s.grad_accumulation).backward()
            losses.append(float(loss.detach()))
            last = k == micro_batches - 1
            if (k + 1) % s.grad_accumulation == 0 or last:
                if s.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(parameters, max_norm=s.max_grad_norm)
                run.lr_curve.append(float(optimizer.param_groups[0]["lr"]))
                optimizer.step()
                optimizer.zero_grad()
                run.loss_curve.append(sum(losses) / len(losses))
                losses = []
                run.steps += 1
                if s.scheduler_steps == "optimizer_step":
                    scheduler.step()
            if s.scheduler_steps == "micro_batch":
                scheduler.step()
    network.eval()
    run.loss_after = full_loss(forward, store, s.batch_size, hidden, device)
    return run


def untrained(run: TrainingRun) -> bool:
    """Whether training left the network as it was built: fewer than :data:`MIN_TRAINED_STEPS`
    optimizer steps, or none at a learning rate above 0."""
    return run.steps < MIN_TRAINED_STEPS or max(run.lr_curve, default=0.0) <= 0.0


def init_std(adapter, ffn_init: str) -> float | None:
    """The standard deviation the FFN's weights are drawn with: the model's ``initializer_range``
    for ``ffn_init="normal"`` (its text config's, for a multimodal model), None for ``"pytorch"``."""
    if ffn_init == "pytorch":
        return None
    config = adapter.config
    config = getattr(config, "text_config", None) or config
    return float(getattr(config, "initializer_range", None) or DEFAULT_INITIALIZER_RANGE)


@dataclass
class Replacement:
    """What replaces a cut: ``cut`` (as selected), ``cuts`` (the blocks removed: the cut, or for
    the layer variant the cut without its first block), ``block_states`` (the layer variant's
    retrained block, by original index), ``networks`` (the FFN variant's network, by the original
    index of the block it follows), ``run`` and the row's ``columns``."""

    cut: Cut
    cuts: list[Cut]
    block_states: dict[int, dict[str, torch.Tensor]]
    networks: dict[int, ReplacementFFN]
    columns: dict


class StreamlineEstimator(Estimator):
    """LLM-Streamline's layer replacement (module docstring); ``objective=streamline_ffn`` or
    ``objective=streamline_layer``. Fits no T: :meth:`replace` trains the network of a cut."""


    def __init__(self, name: str, replacement: str, **settings):
        self.name, self.replacement = name, replacement
        self.settings = SimpleNamespace(**settings)

    @classmethod
    def requirements(cls, objective) -> Requirements:
        return Requirements(
            statistics=False,
            fits_transform=False,
            uses_alpha=False,
            alpha_scale=None,
            regularizers=("none",),
            replacement=objective.replacement,
            beside_weights=objective.replacement == "ffn",  # the FFN after the block before the cut
            extra_blocks=1 if objective.replacement == "layer" else 0,  # the cut's first block, retrained, stays
        )

    def estimate(self, stats, alpha: float, structure: str = "generic") -> None:
        return None

    def replace(
        self,
        adapter,
        batches: TokenBatches,
        cut: Cut,
        seed: int,
        store_location: str = "cpu",
        directory=None,
        execution: CaptureExecution | None = None,
    ) -> Replacement:
        """Train the network replacing ``cut`` (original indices of the unpruned model behind
        ``adapter``, left as it was) on ``batches``, on the device the capture plan ``execution``
        computes on (None: the model's)."""
        start, end = cut
        device, hidden, s = input_device(adapter, execution), adapter.hidden_size, self.settings
        store = SequenceStore(store_location, directory)
        try:
            with stage("capture", "capture (cut states)"):
                capture_cut_states(adapter, batches, cut, store)
            with stage("estimate", f"LLM-Streamline training ({self.replacement})"), torch.enable_grad():
                torch.manual_seed(seed)
                if self.replacement == "ffn":
                    network = ReplacementFFN(hidden, s.ffn_expansion, init_std(adapter, s.ffn_init)).to(device)

                    def forward(x, positions, mask):
                        return network(x)
                else:
                    network = copy.deepcopy(adapter.layers[start]).to(device=device, dtype=torch.float32)
                    network.requires_grad_(True)
                    forward = BlockRunner(adapter, network)
                run = train(network, forward, store, s, seed, hidden, device)
            n_sequences, n_tokens = len(store), store.n_tokens
        finally:
            store.close()
        added = sum(p.numel() for p in network.parameters())
        columns = {
            "replaced_cut": [start, end],
            "replacement_loss_before": run.loss_before,
            "replacement_loss_after": run.loss_after,
            "replacement_loss_first": run.loss_curve[0] if run.loss_curve else None,
            "replacement_loss_last": run.loss_curve[-1] if run.loss_curve else None,
            "replacement_loss_curve": run.loss_curve,
            "replacement_steps": run.steps,
            "replacement_lr_max": max(run.lr_curve, default=None),
            "untrained": untrained(run),
            "replacement_sequences": n_sequences,
            "replacement_tokens": n_tokens,
        }
        if self.replacement == "ffn":
            columns["replacement_params_added"] = added
            columns["replacement_init_std"] = init_std(adapter, s.ffn_init)
            return Replacement(cut, [cut], {}, {start - 1: network.cpu()}, columns)
        columns["replacement_params_added"] = 0  # the retrained block was one of the model's
        state = {name: p.detach().cpu() for name, p in network.named_parameters()}
        return Replacement(cut, [(start + 1, end)], {start: state}, {}, columns)
