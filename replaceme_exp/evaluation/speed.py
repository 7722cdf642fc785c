"""What pruning buys, measured on the job's device in the same way for every method: prefill and
greedy-decode throughput, peak inference memory, parameters and checkpoint size of a pruned model
against the unpruned one (``eval.speed``).

:func:`compare_speed` measures several models (``{"unpruned": ..., "pruned": ...}``) alternately in
one process on the same seeded random token ids: ``warmup`` untimed rounds, then ``rounds`` timed
rounds, round ``r`` visiting the models in the given order when ``r`` is even and in reverse when it
is odd (drift of the machine's speed, e.g. another process starting, then falls on both models
alike). Each visit is two runs, each a prefill and ``gen_len`` greedy single-token decode steps from
the KV cache:

- batch 1: the decode steps are timed (``decode_b1``);
- batch ``batch``: the prefill (one forward of ``batch x prompt_len`` tokens, ``use_cache=True``,
  logits of the last position only, as ``generate`` computes them) and the decode steps are timed
  separately (``prefill``, ``decode_batch``).

The clock (``time.perf_counter``, CUDA synchronised before each reading) brackets the prefill's
forward alone, and the decode loop alone: prefill excluded. Each metric's time is the median over
the timed rounds; throughput is its tokens over that median. A speedup is the baseline's median time
over the other model's; its interval is the range (min, max) of the per-round paired ratios (round
``r``'s baseline time over round ``r``'s time of the other model), kept with every round's times.

Memory, after the timed rounds, one model at a time: one untimed prefill + decode run at batch
``batch``. On CUDA, ``torch.cuda.max_memory_allocated`` above what was allocated before the run
(peak statistics reset first). On a CPU, the running sum of the torch profiler's allocation and free
events during the run (its maximum): exact bytes of the tensors the run allocates, deterministic and
the run's own. The alternative, ``/proc/self/clear_refs`` + ``VmHWM``, measures the whole process's
resident pages: the other model, allocator caches and glibc fragmentation (tens of MB between
identical runs) move it, so it cannot say what one of two resident models needs. The profiler's count
leaves out memory outside torch's allocator (oneDNN scratch, allocator slack), so it is a lower bound
of the resident growth. A model's peak inference memory is its weights' bytes (unique tensors, plus
what it carries beside them: a separate T, an FFN replacement) plus this peak working memory, so two
models resident in one process do not count each other.

Parameters and checkpoint size count unique tensors (tied embeddings once) and include what a pruned
model carries beyond its blocks (:func:`~replaceme_exp.surgery.beside_weights`).
"""

from __future__ import annotations

import inspect
import json
import logging
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
from torch import nn

from replaceme_exp.config.schema import SpeedConfig
from replaceme_exp.errors import ConfigError
from replaceme_exp.progress import progress_counter
from replaceme_exp.surgery import beside_weights

log = logging.getLogger(__name__)

SEED = 0  # of the random token ids (one generator, the same ids for every model)
METRICS = ("prefill", "decode_b1", "decode_batch")  # the timed quantities, each in seconds per round
GIB = 2**30

# What each column of :meth:`SpeedComparison.row` means (for replaceme_exp/results/columns.py).
SPEED_COLUMNS: dict[str, str] = {
    "speed_prompt_len": "Speed: tokens of each random prompt (`eval.speed.prompt_len`).",
    "speed_gen_len": "Speed: greedy single-token decode steps timed after the prefill (`eval.speed.gen_len`).",
    "speed_batch": "Speed: the larger batch, of the prefill, `speed_decode_batch_*` and the memory run "
    "(`eval.speed.batch`).",
    "speed_rounds": "Speed: timed rounds; every speed metric is a median over them (`eval.speed.rounds`).",
    "speed_warmup": "Speed: untimed rounds before them (`eval.speed.warmup`).",
    "speed_jobs_per_architecture": "Speed: jobs that measure an architecture on one machine before later jobs "
    "reuse their figures (`eval.speed.jobs_per_architecture`; 0: every job measures).",
    "speed_threads": "Speed: torch's intra-op CPU threads while measuring.",
    "speed_device": "Speed: the device both models ran on.",
    "speed_dtype": "Speed: the models' weights' dtype.",
    "speed_memory_method": "How the peak working memory was measured: `cuda_max_memory_allocated`, or on a CPU "
    "`profiler_memory_events` (the peak of the running sum of the torch profiler's allocation events).",
    "speed_prefill_tok_s": "Prefill throughput of the pruned model, tokens/s: `speed_batch x speed_prompt_len` "
    "over the median time of one forward (`use_cache=True`, last position's logits).",
    "speed_decode_b1_tok_s": "Greedy decode throughput of the pruned model at batch 1, tokens/s: "
    "`speed_gen_len` over the median time of the decode loop from the KV cache (prefill excluded).",
    "speed_decode_batch_tok_s": "The same at batch `speed_batch`: `speed_batch x speed_gen_len` tokens.",
    "speed_<prefill|decode_b1|decode_batch>_tok_s_baseline": "The same of the unpruned model, measured "
    "alternately with it in the same process.",
    "speed_<prefill|decode_b1|decode_batch>_speedup": "The unpruned model's median time over the pruned one's "
    "(> 1: the pruned model is faster).",
    "speed_<prefill|decode_b1|decode_batch>_speedup_<min|max>": "The range of the per-round paired ratios "
    "(round r's unpruned time over round r's pruned time): the speedup's interval.",
    "speed_round_times": "JSON: every timed round's seconds per metric and model, and the order the models "
    "ran in each round.",
    "peak_infer_mem_gb": "The pruned model's peak inference memory, GiB: its weights (with a separate T or FFN) "
    "plus the peak working memory of one prefill + decode run at batch `speed_batch`.",
    "peak_infer_mem_gb_baseline": "The same of the unpruned model.",
    "peak_infer_mem_ratio": "`peak_infer_mem_gb / peak_infer_mem_gb_baseline`.",
    "peak_infer_work_gb": "The pruned model's peak working memory alone (activations, KV cache, logits), GiB.",
    "peak_infer_work_gb_baseline": "The same of the unpruned model.",
    "param_count": "Parameters of the pruned model: unique tensors (tied embeddings once), with a separate T "
    "or an FFN replacement it carries.",
    "param_count_baseline": "The same of the unpruned model.",
    "param_count_ratio": "`param_count / param_count_baseline`.",
    "checkpoint_bytes": "Bytes of the tensors the pruned model's checkpoint holds (`save_pretrained`'s unique "
    "tensors in their dtype, and the files beside them).",
    "checkpoint_bytes_baseline": "The same of the unpruned model.",
    "checkpoint_bytes_ratio": "`checkpoint_bytes / checkpoint_bytes_baseline`.",
}


# ---------------------------------------------------------------------------------------------
# sizes


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` with each storage region once (tied weights are one tensor)."""
    seen: set[tuple] = set()
    out = []
    for t in tensors:
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape)) if t.numel() else (id(t),)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _extra_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t for tensors in beside_weights(model).values() for t in tensors.values()]


def parameter_count(model: nn.Module) -> int:
    """Parameters of ``model``: its unique parameter tensors (tied embeddings once) plus the
    tensors it carries beside them (a separate T: d x d; an FFN replacement's weights and biases)."""
    own = sum(p.numel() for p in _unique(model.parameters()))
    return own + sum(t.numel() for t in _extra_tensors(model))


def checkpoint_bytes(model: nn.Module) -> int:
    """Bytes of tensor data a saved checkpoint of ``model`` holds: the unique tensors of its state
    dict (what ``save_pretrained`` writes; tied ones once) in their dtype, plus the tensors
    :func:`~replaceme_exp.surgery.save_checkpoint` writes beside them. File headers, the config and
    the tokenizer are not counted."""
    own = sum(t.numel() * t.element_size() for t in _unique(model.state_dict(keep_vars=True).values()))
    return own + sum(t.numel() * t.element_size() for t in _extra_tensors(model))


def resident_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s weights in memory: unique parameters and buffers, plus a separate T or
    FFN replacement at the dtype of the block it is attached to (the model's first parameter's)."""
    own = sum(t.numel() * t.element_size() for t in _unique([*model.parameters(), *model.buffers()]))
    size = next(model.parameters()).element_size()
    return own + sum(t.numel() * size for t in _extra_tensors(model))


# Room a second copy of the model needs beyond its weights (activations, the KV cache, the allocator).
COPY_HEADROOM = 1.25


def room_for_a_copy(model: nn.Module, unpruned_bytes: int) -> str | None:
    """Why an unpruned copy of ``unpruned_bytes`` cannot be loaded beside ``model`` on its device for
    the comparison (None: it fits): ``COPY_HEADROOM`` times its weights in free GPU memory (CUDA), or in
    the host's available memory (CPU)."""
    device, need = _device(model), int(unpruned_bytes * COPY_HEADROOM)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        where = f"GPU {device}"
    else:
        import psutil

        free, where = psutil.virtual_memory().available, "host memory"
    if free < need:
        return f"an unpruned copy needs {need / 2**30:.1f} GiB, {where} has {free / 2**30:.1f} GiB free"
    return None


# ---------------------------------------------------------------------------------------------
# one run: prefill, then greedy decode from the KV cache


def _synchronize(devices: Iterable[torch.device]) -> None:
    """Wait for the work queued on ``devices`` (a model spread over GPUs: each of them)."""
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()


def _device(model: nn.Module) -> torch.device:
    return model.get_input_embeddings().weight.device


def _devices(model: nn.Module) -> list[torch.device]:
    """Every device holding a parameter of ``model`` (several with ``device_map=auto``)."""
    return sorted({p.device for p in model.parameters()}, key=str)


def _cache_keyword(model: nn.Module) -> str:
    """The forward's keyword of the KV cache: ``cache`` in recent transformers (5.24 here; the old
    ``past_key_values`` is deprecated), ``past_key_values`` in earlier ones."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_of(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


@dataclass
class RunTimes:
    """One run: seconds of the prefill's forward and of the decode loop after it, and the greedy
    tokens the loop generated, (batch, gen_len)."""

    prefill_s: float
    decode_s: float
    tokens: torch.Tensor


def timed_run(model: nn.Module, ids: torch.Tensor, gen_len: int, clock: Callable[[], float]) -> RunTimes:
    """Prefill ``ids`` (batch, prompt_len) with ``use_cache=True``, then ``gen_len`` greedy steps, each
    feeding the previous step's argmax (batch, 1) with the cache. Returns the prefill's seconds, the
    decode loop's (from after the prefill's argmax to after the last step's) and the ``gen_len``
    tokens the steps chose. Call under :func:`torch.inference_mode`."""
    devices = _devices(model)
    ids = ids.to(_device(model))
    keyword = _cache_keyword(model)
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    _synchronize(devices)
    start = clock()
    out = model(input_ids=ids, use_cache=True, **last_only)
    _synchronize(devices)
    prefill = clock() - start
    cache = _cache_of(out)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    del out
    chosen = []
    _synchronize(devices)
    start = clock()
    for _ in range(gen_len):
        out = model(input_ids=token, use_cache=True, **{keyword: cache})
        cache = _cache_of(out)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        chosen.append(token)
    _synchronize(devices)
    decode = clock() - start
    return RunTimes(prefill, decode, torch.cat(chosen, dim=1))


# ---------------------------------------------------------------------------------------------
# peak working memory


def peak_working_bytes(fn: Callable[[], object], devices: list[torch.device]) -> tuple[int | None, str]:
    """(peak bytes of tensors alive while ``fn`` runs above those alive before it, the method), for a
    model on ``devices``.

    CUDA: ``max_memory_allocated`` (reset first) minus what was allocated before, summed over the
    GPUs (an upper bound when their peaks fall at different times). CPU: the maximum of the running
    sum of the torch profiler's allocation (+) and free (-) events in time order (frees of tensors
    allocated before the run have no event, so they cannot lower the count). Other devices, or a mix
    of CPU and GPU: ``(None, "unmeasured")``."""
    kinds = {d.type for d in devices}
    if kinds == {"cuda"}:
        _synchronize(devices)
        base = {d: torch.cuda.memory_allocated(d) for d in devices}
        for d in devices:
            torch.cuda.reset_peak_memory_stats(d)
        fn()
        _synchronize(devices)
        return sum(torch.cuda.max_memory_allocated(d) - base[d] for d in devices), "cuda_max_memory_allocated"
    if kinds != {"cpu"}:
        return None, "unmeasured"
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak, "profiler_memory_events"


# ---------------------------------------------------------------------------------------------
# the comparison


@dataclass
class ModelSpeed:
    """One model's measurements: seconds per timed round of each of :data:`METRICS`, the tokens
    each processes, sizes (parameters, checkpoint bytes, resident weight bytes) and peak working
    bytes of one run (None where unmeasured)."""

    params: int
    checkpoint_bytes: int
    weight_bytes: int
    tokens: dict[str, int]
    seconds: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METRICS})
    peak_work_bytes: int | None = None

    def add_round(self, one: RunTimes, batch: RunTimes) -> None:
        """Record a timed round's visit: the batch run's prefill and both runs' decode loops."""
        self.seconds["prefill"].append(batch.prefill_s)
        self.seconds["decode_b1"].append(one.decode_s)
        self.seconds["decode_batch"].append(batch.decode_s)

    def median_s(self, metric: str) -> float:
        return statistics.median(self.seconds[metric])

    def tok_s(self, metric: str) -> float:
        """Tokens per second: the metric's tokens over its median time."""
        return self.tokens[metric] / self.median_s(metric)

    @property
    def peak_bytes(self) -> int | None:
        return None if self.peak_work_bytes is None else self.weight_bytes + self.peak_work_bytes


@dataclass
class SpeedComparison:
    """The models' measurements (:class:`ModelSpeed` by name), the settings they were taken with
    (the ``speed_*`` setting columns) and each timed round's visiting order."""

    settings: dict
    models: dict[str, ModelSpeed]
    orders: list[list[str]]

    def speedup(self, metric: str, subject: str, baseline: str) -> tuple[float, float, float]:
        """(``baseline``'s median time / ``subject``'s, min and max of the per-round paired ratios)."""
        base, sub = self.models[baseline].seconds[metric], self.models[subject].seconds[metric]
        paired = [b / s for b, s in zip(base, sub)]
        return statistics.median(base) / statistics.median(sub), min(paired), max(paired)

    def round_times(self, names: Iterable[str] | None = None) -> str:
        """JSON: ``{"order": [[name, ...] per round], name: {metric: [seconds per round]}}``."""
        names = list(names or self.models)
        data = {"order": [[n for n in order if n in names] for order in self.orders]}
        for name in names:
            data[name] = {f"{m}_s": list(self.models[name].seconds[m]) for m in METRICS}
        return json.dumps(data)

    def row(self, subject: str = "pruned", baseline: str = "unpruned") -> dict:
        """Flat row columns (:data:`SPEED_COLUMNS`) of ``subject`` against ``baseline``."""
        sub, base = self.models[subject], self.models[baseline]
        out = dict(self.settings)
        for metric in METRICS:
            ratio, low, high = self.speedup(metric, subject, baseline)
            out[f"speed_{metric}_tok_s"] = sub.tok_s(metric)
            out[f"speed_{metric}_tok_s_baseline"] = base.tok_s(metric)
            out[f"speed_{metric}_speedup"] = ratio
            out[f"speed_{metric}_speedup_min"] = low
            out[f"speed_{metric}_speedup_max"] = high
        out["speed_round_times"] = self.round_times([baseline, subject])
        measured = sub.peak_bytes is not None and base.peak_bytes is not None
        out["peak_infer_mem_gb"] = sub.peak_bytes / GIB if measured else None
        out["peak_infer_mem_gb_baseline"] = base.peak_bytes / GIB if measured else None
        out["peak_infer_mem_ratio"] = sub.peak_bytes / base.peak_bytes if measured else None
        out["peak_infer_work_gb"] = sub.peak_work_bytes / GIB if measured else None
        out["peak_infer_work_gb_baseline"] = base.peak_work_bytes / GIB if measured else None
        for name, attr in (("param_count", "params"), ("checkpoint_bytes", "checkpoint_bytes")):
            out[name] = getattr(sub, attr)
            out[f"{name}_baseline"] = getattr(base, attr)
            out[f"{name}_ratio"] = getattr(sub, attr) / getattr(base, attr)
        return out


def setting_columns(settings: SpeedConfig, device: torch.device, dtype: torch.dtype, memory_method: str) -> dict:
    """The ``speed_*`` setting columns: ``eval.speed``'s keys, torch's CPU threads now, the device,
    the weights' dtype and how memory was measured."""
    return {
        "speed_prompt_len": settings.prompt_len,
        "speed_gen_len": settings.gen_len,
        "speed_batch": settings.batch,
        "speed_rounds": settings.rounds,
        "speed_warmup": settings.warmup,
        "speed_jobs_per_architecture": settings.jobs_per_architecture,
        "speed_threads": torch.get_num_threads(),
        "speed_device": str(device),
        "speed_dtype": str(dtype).removeprefix("torch."),
        "speed_memory_method": memory_method,
    }


def round_order(names: list[str], r: int) -> list[str]:
    """The models' order in timed round ``r`` (0-based): as given when ``r`` is even, reversed when odd."""
    return list(names) if r % 2 == 0 else list(reversed(names))


def _check(models: dict[str, nn.Module], settings: SpeedConfig) -> tuple[torch.device, int]:
    """(the models' device, their vocabulary size); one clear error before any work."""
    if len(models) < 2:
        raise ValueError(f"compare_speed needs at least two models to compare, got {sorted(models)}")
    devices = {str(_device(m)) for m in models.values()}
    if len(devices) > 1:
        raise ValueError(f"compare_speed: the models are on different devices ({sorted(devices)}); put them on one")
    vocabs = {m.get_input_embeddings().num_embeddings for m in models.values()}
    if len(vocabs) > 1:
        raise ValueError(f"compare_speed: the models' vocabularies differ ({sorted(vocabs)})")
    for name, model in models.items():
        limit = getattr(model.config, "max_position_embeddings", None)
        if isinstance(limit, int) and settings.prompt_len + settings.gen_len > limit:
            raise ConfigError(
                "eval.speed.prompt_len",
                settings.prompt_len,
                f"with eval.speed.gen_len={settings.gen_len} exceeds {name}'s {limit} positions",
            )
    return _device(next(iter(models.values()))), vocabs.pop()


@dataclass(frozen=True)
class Workload:
    """What a visit runs every model on: the random token ids ``one`` (1, prompt_len) and ``batch``
    (batch, prompt_len), each followed by ``gen_len`` greedy steps, timed by ``clock``."""

    one: torch.Tensor
    batch: torch.Tensor
    gen_len: int
    clock: Callable[[], float]

    @classmethod
    def draw(cls, settings: SpeedConfig, vocab: int, seed: int, clock: Callable[[], float]) -> Workload:
        """The ids drawn once from a ``torch.Generator`` seeded with ``seed``, batch 1 first."""
        generator = torch.Generator().manual_seed(seed)
        one = torch.randint(0, vocab, (1, settings.prompt_len), generator=generator)
        batch = torch.randint(0, vocab, (settings.batch, settings.prompt_len), generator=generator)
        return cls(one, batch, settings.gen_len, clock)

    def visit(self, model: nn.Module) -> tuple[RunTimes, RunTimes]:
        """The batch-1 run of ``model``, then its batch run (:func:`timed_run`)."""
        one = timed_run(model, self.one, self.gen_len, self.clock)
        return one, timed_run(model, self.batch, self.gen_len, self.clock)

    def peak_work_bytes(self, model: nn.Module) -> tuple[int | None, str]:
        """:func:`peak_working_bytes` of one batch run of ``model``."""
        return peak_working_bytes(lambda: timed_run(model, self.batch, self.gen_len, self.clock), _devices(model))


@contextmanager
def in_eval_mode(models: Iterable[nn.Module]) -> Iterator[None]:
    """Within the block, ``models`` in eval mode; after it, each in the mode it had."""
    modes = [(model, model.training) for model in models]
    try:
        for model, _ in modes:
            model.eval()
        yield
    finally:
        for model, training in modes:
            model.train(training)


def compare_speed(
    models: dict[str, nn.Module],
    settings: SpeedConfig,
    *,
    seed: int = SEED,
    clock: Callable[[], float] = time.perf_counter,
) -> SpeedComparison:
    """Measure ``models`` (name -> causal LM, e.g. ``{"unpruned": a, "pruned": b}``, all on one
    device) alternately on the same random token ids (module docstring); returns a
    :class:`SpeedComparison` whose :meth:`~SpeedComparison.row` gives the row's columns.

    Inputs: batch-1 ids (1, prompt_len) and batch ids (batch, prompt_len) drawn once from a
    ``torch.Generator`` seeded with ``seed``. ``clock`` reads seconds (``time.perf_counter``)."""
    device, vocab = _check(models, settings)
    names, workload = list(models), Workload.draw(settings, vocab, seed, clock)
    tokens = {
        "prefill": settings.batch * settings.prompt_len,
        "decode_b1": settings.gen_len,
        "decode_batch": settings.batch * settings.gen_len,
    }
    results = {
        name: ModelSpeed(parameter_count(m), checkpoint_bytes(m), resident_bytes(m), dict(tokens))
        for name, m in models.items()
    }
    orders = [round_order(names, r) for r in range(settings.rounds)]
    total = (settings.warmup + settings.rounds + 1) * len(names)
    with in_eval_mode(models.values()), torch.inference_mode(), progress_counter(total, "speed", "run") as counter:
        for name in names * settings.warmup:  # the untimed rounds
            workload.visit(models[name])
            counter.update()
        for name in (name for order in orders for name in order):
            results[name].add_round(*workload.visit(models[name]))
            counter.update()
        method = "unmeasured"
        for name in names:
            results[name].peak_work_bytes, method = workload.peak_work_bytes(models[name])
            counter.update()
    dtype = next(next(iter(models.values())).parameters()).dtype
    comparison = SpeedComparison(setting_columns(settings, device, dtype, method), results, orders)
    for name in names[1:]:
        ratios = ", ".join(f"{m} {comparison.speedup(m, name, names[0])[0]:.2f}x" for m in METRICS)
        log.info("speed of %s against %s: %s", name, names[0], ratios)
    return comparison


def across_jobs(rows: list[dict]) -> dict:
    """The speed figures of several jobs' measurements of one architecture (their speed rows): each
    speedup and throughput the median over the jobs, a speedup's ``_min`` / ``_max`` the range of the
    jobs' speedups (the spread between jobs); every other column the first job's. Rounds' times are the
    jobs' own, so none is kept."""
    out = dict(rows[0])
    for metric in METRICS:
        for column in (f"speed_{metric}_tok_s", f"speed_{metric}_tok_s_baseline", f"speed_{metric}_speedup"):
            values = [r[column] for r in rows if r.get(column) is not None]
            out[column] = statistics.median(values) if values else None
        speedups = [r[f"speed_{metric}_speedup"] for r in rows if r.get(f"speed_{metric}_speedup") is not None]
        out[f"speed_{metric}_speedup_min"] = min(speedups) if speedups else None
        out[f"speed_{metric}_speedup_max"] = max(speedups) if speedups else None
    out["speed_round_times"] = None
    return out
