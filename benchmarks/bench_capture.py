"""Capture speed and LS-path memory on SmolLM2 (or any model config), as ratios on one machine.

    make bench                       # SmolLM2, default calibration
    python benchmarks/bench_capture.py model=tiny_llama n_prune=2   # any Hydra overrides
    python benchmarks/bench_capture.py --only capture,startup       # some sections (SECTIONS) only

Prints progress, then as its last line one JSON object (``sections``: those that ran; the plain
forward pass, every ratio's denominator, always runs):
- capture_over_forward: wall time of all capture passes of the default job (selection and LS
  statistics, as ``select_and_capture`` runs them for the plan the job picks, ``capture.passes=auto``)
  / wall time of one plain forward pass over the same tokens through all blocks (no hooks, nothing
  kept), the two alternating in each of 3 rounds: the median of the rounds' ratios and their range
  (``_min``, ``_max``). capture_one_pass_over_forward: the one-pass plan, candidates out of the
  running dropping their statistics (``capture.drop_candidates``, the default;
  capture_needed_second_pass: whether the selected cut had dropped out);
  capture_every_candidate_over_forward: the same with every candidate's statistics to the end;
  capture_two_passes_over_forward: distances first, then the chosen cut's statistics.
- cosine_paper_*: the paper's Adam recipe for the cosine objective (lr 1e-4, batches of 1024
  tokens, 10 epochs, identity init) on the default cut's stored calibration tokens: fitting time
  and held-out mean cosine distance between L_{end-1} and Y + M T; cosine_fast_*: the fastest
  configuration found that reaches the paper recipe's held-out distance (Adam, lr 1e-3, one
  epoch); cosine_lbfgs_*: full-batch L-BFGS (25 iterations), slower but lower distance;
  cosine_lbfgs_minibatch_*: one L-BFGS step per 1024-token batch, 10 epochs; *_float32: the same in
  float32 (``objective.precision``), and cosine_lbfgs*_float64_over_float32 the time ratios.
  store_bytes_per_token: the token store of the cosine objective (M and L - Y in bfloat16).
- capture_layerwise_over_whole: the one-pass capture with the model in host memory and one block
  at a time on the compute device (``capture.mode=layerwise``) / the same whole-model.
- statistics_float32_over_float64: a capture of every candidate's LS statistics with float32
  products (``capture.precision=float32``) / with float64 products; statistics_float64_over_forward
  and statistics_float32_over_forward: each / the forward pass. ls_solve_s: one cut's solve.
- whole_peak_gib / layerwise_peak_gib (GPU only): peak memory above the resident weights during the
  one-pass capture, against *_planned_gib: what the capture plan counts for it (one batch's
  activations, the statistics and, layer-wise, the largest block).
- ls_peak_mem_ratio_4x_data: peak memory of the LS path (statistics capture and solve) with 4x
  the calibration tokens / the same with 1x (full windows of 128 tokens). Peak CUDA memory on a
  GPU; on a CPU the peak of live tensor bytes from the profiler's allocation events.
- the fixed cost of a job, each / the same plain forward pass and (``*_over_import_torch``) / a
  fresh interpreter's ``import torch`` (``import_torch_s``, best of 3) (``*_s``: the seconds):
  import_job_over_forward: ``import run`` (run.py's imports: the job's modules, torch, Hydra) in a
  fresh interpreter (best of 3);
  start_to_first_stage_over_forward: from launching ``run.py`` (the ``debug=smoke`` job on the
  same model without generation samples, with the default tracking: W&B offline and CodeCarbon;
  a ``protocol=`` override of the bench's goes to that job too)
  to its first ``stage ...`` log line, Hydra's start-up included; outside_stages_over_forward: all
  of that job's time outside its stages (before the first, ``between_stages_s`` between them,
  ``after_last_stage_s`` from the last one to the process's exit), from the stage lines' log
  timestamps (1 ms).
- what pruning buys (``eval.speed``; ``eval.speed.enabled=false`` leaves it out): the unpruned model
  against two pruned copies, ``n_prune`` blocks of the selected cut removed by plain removal
  (``speed_plain_*``: the structure and so the speed of a fused T too) and with the cut's LS
  transform as a separate T (``speed_separate_*``), measured alternately in one process
  (replaceme_exp/evaluation/speed.py): ``*_speedup`` (the unpruned model's median time over the pruned
  one's) of the prefill (``batch x prompt_len``), of greedy decoding at batch 1 and at ``batch``, each
  with ``*_speedup_min`` / ``*_speedup_max`` (the range of the per-round paired ratios); the ratios
  pruned / unpruned of peak inference memory, parameters and checkpoint bytes; ``speed_*_tok_s`` the
  unpruned model's throughputs, and the settings.
- lm_eval_scored_positions_speedup: lm-eval's loglikelihood requests (multiple-choice shaped: 64
  contexts of 40-120 calibration tokens, four continuations of 1-4 tokens each, batch 8) scored by
  lm-eval's own HFLM over every position / by the project's harness model, whose LM head projects
  only the scored positions (replaceme_exp/evaluation/scored_positions.py); median of 3 alternating
  rounds, with ``_min`` / ``_max``. The two give the same log-likelihoods (checked here, to 1e-4).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from replaceme_exp.capture import CutDistances, LinearStatistics, plain_forward, run_capture  # noqa: E402
from replaceme_exp.capture.cache import StatisticsCache  # noqa: E402
from replaceme_exp.capture.execution import CaptureExecution, model_memory, plan_execution  # noqa: E402
from replaceme_exp.capture.statistics import TokenCollector  # noqa: E402
from replaceme_exp.capture.token_store import TokenStore  # noqa: E402
from replaceme_exp.config.store import register_schemas  # noqa: E402
from replaceme_exp.data import (  # noqa: E402
    CALIBRATION_SOURCES,
    build_calibration,
    heldout_windows,
    pack_windows,
)
from replaceme_exp.estimation import ridge_solve  # noqa: E402
from replaceme_exp.estimation.numerical import NumericalEstimator  # noqa: E402
from replaceme_exp.evaluation.speed import METRICS, compare_speed  # noqa: E402
from replaceme_exp.models import adapter_for, load_model  # noqa: E402
from replaceme_exp.pipeline.spec import JobSpec  # noqa: E402
from replaceme_exp.selection import candidate_cuts, cut_length, select_cuts  # noqa: E402
from replaceme_exp.selection.passes import all_candidates_fit, cut_stats_bytes, select_and_capture  # noqa: E402
from replaceme_exp.stages import observed_by  # noqa: E402
from replaceme_exp.surgery import prune  # noqa: E402


def config(overrides):
    """The job's config; calibration on pydoc prose and 8 blocks unless overridden (the numbers of
    the table in docs/measurements/benchmarks.md; the default job's self-generated chats would first
    generate)."""
    register_schemas()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["calibration=pydoc", "n_prune=8", *overrides])


def timed(fn, repeats=1):
    best = float("inf")
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


def peak_live_bytes(fn, device: torch.device) -> int:
    """Peak bytes of tensors alive while ``fn`` runs, above those alive before it.

    GPU: the CUDA allocator's peak. CPU: the running sum of the profiler's allocation and free
    events (deterministic, unlike the resident set size, which glibc fragmentation and per-shape
    kernel caches make vary by tens of MB between identical runs).
    """
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
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
    return peak


def ls_path_peak(adapter, tokenizer, cfg, n_windows: int, seq_len: int) -> tuple[int, int]:
    """(tokens, peak live bytes) of the LS path (statistics of one cut, then the solve) on
    ``n_windows`` full windows of calibration text: every batch has the same shape, so only the
    amount of data changes between sizes."""
    source = CALIBRATION_SOURCES.get(cfg.calibration.source)
    documents = source.read(cfg.calibration, tokenizer, cfg.calibration.n_samples, 0, None)
    batches = pack_windows(documents, tokenizer, seq_len, n_windows, cfg.calibration.batch_size)
    if batches.n_sequences < n_windows:
        raise SystemExit(f"only {batches.n_sequences} windows of {seq_len} tokens in the calibration text")
    length = cut_length(cfg.n_prune, 1, adapter.num_layers)
    cut = (adapter.num_layers - length - 1, adapter.num_layers - 1)
    device = adapter.backbone.embed_tokens.weight.device

    def ls_path():
        stats = LinearStatistics([cut], adapter.hidden_size, device)
        run_capture(adapter, batches, [stats])
        ridge_solve(stats.result()[cut], 0.0)

    return batches.n_tokens, peak_live_bytes(ls_path, device)


COSINE_CONFIGS = {
    "paper": dict(lr=1e-4, batch_tokens=1024, epochs=10),
    "fast": dict(lr=1e-3, batch_tokens=1024, epochs=1),
    "lbfgs": dict(solver="lbfgs", max_iter=25, chunk_tokens=32768),
    # The official code's schedule: one L-BFGS step per shuffled 1024-token batch, 10 epochs.
    "lbfgs_minibatch": dict(solver="lbfgs", schedule="minibatch", batch_tokens=1024, epochs=10),
    # The same two in float32, the official code's precision (objective.precision; float64 is the default).
    "lbfgs_float32": dict(solver="lbfgs", max_iter=25, chunk_tokens=32768, precision="float32"),
    "lbfgs_minibatch_float32": dict(
        solver="lbfgs", schedule="minibatch", batch_tokens=1024, epochs=10, precision="float32"
    ),
}


def cosine_solvers(adapter, tokenizer, cfg, batches, cut) -> dict:
    """Time and held-out quality of the cosine objective under each of ``COSINE_CONFIGS``, all
    on the same stored calibration tokens of ``cut``."""
    device = adapter.backbone.embed_tokens.weight.device
    store = TokenStore(("M", "R"), batches.n_tokens, adapter.hidden_size, device)
    run_capture(adapter, batches, [TokenCollector(cut, store)])
    windows = heldout_windows(cfg.eval, tokenizer)
    heldout = TokenStore(("M", "R", "Y"), windows.n_tokens, adapter.hidden_size, device, dtype=torch.float32)
    run_capture(adapter, windows, [TokenCollector(cut, heldout)])
    m, r, y = (heldout.tensors[k] for k in ("M", "R", "Y"))

    def heldout_cos(transform):
        received = y + m @ transform.to(device=m.device, dtype=m.dtype)
        return float((1 - torch.nn.functional.cosine_similarity(received, r + y, dim=-1)).mean())

    out = {"store_bytes_per_token": store.nbytes / store.n_tokens}
    for name, kwargs in COSINE_CONFIGS.items():
        estimator = NumericalEstimator("cosine", "cosine", **kwargs)
        seconds, (transform, _) = timed(lambda e=estimator: e.fit(store, 0.0, "none", "generic", 0))
        out[f"cosine_{name}_time_s"] = round(seconds, 3)
        out[f"cosine_{name}_heldout_cos"] = round(heldout_cos(transform), 5)
        print(f"cosine {name} {kwargs}: {seconds:.2f} s, held-out cosine distance {out[f'cosine_{name}_heldout_cos']}")
    out["cosine_fast_config"] = COSINE_CONFIGS["fast"]
    out["cosine_fast_speedup"] = round(out["cosine_paper_time_s"] / out["cosine_fast_time_s"], 2)
    for name in ("lbfgs", "lbfgs_minibatch"):
        ratio = out[f"cosine_{name}_time_s"] / out[f"cosine_{name}_float32_time_s"]
        out[f"cosine_{name}_float64_over_float32"] = round(ratio, 2)
    return out


# What run.py logs for each stage ("stage <name> ..." and "stage <name> done in <s> s") in Hydra's log format.
STAGE_LINE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[[^\]]*\]\[[A-Z]+\] - stage (.+?) (\.\.\.|done in \S+ s)$"
)


def import_seconds(repeats: int = 3, module: str = "run") -> float:
    """``import <module>`` in a fresh interpreter, best of ``repeats`` (``run``: every module a job
    imports before Hydra starts)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    best = float("inf")
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        best = min(best, float(out.stdout.split()[-1]))
    return best


def stage_intervals(log: str) -> list[tuple[float, float]]:
    """(start, end) epoch seconds of every stage in a job's log (nested ones too)."""
    open_stages: dict[str, list[float]] = {}
    intervals = []
    for line in log.splitlines():
        match = STAGE_LINE.match(line.strip())
        if not match:
            continue
        stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        name, what = match.group(2), match.group(3)
        if what == "...":
            open_stages.setdefault(name, []).append(stamp)
        elif open_stages.get(name):
            intervals.append((open_stages[name].pop(), stamp))
    return sorted(intervals)


def job_fixed_cost(overrides: list[str]) -> dict:
    """Seconds of a ``run.py`` job outside its stages: launch -> first stage, between stages, last
    stage -> exit (results, capture statistics and W&B files in a temporary directory)."""
    with tempfile.TemporaryDirectory(prefix="bench-fixed-cost-") as tmp:
        args = [*overrides, f"results_dir={tmp}", f"capture.cache_dir={tmp}/stats", "save_model=false"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        launched = time.time()
        proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
        exited = time.time()
    log = proc.stdout + proc.stderr
    intervals = stage_intervals(log)
    if proc.returncode != 0 or not intervals:
        raise SystemExit(f"the fixed-cost job (run.py {' '.join(args)}) failed:\n{log[-3000:]}")
    between, covered_until = 0.0, intervals[0][1]
    for start, end in intervals[1:]:
        between += max(0.0, start - covered_until)
        covered_until = max(covered_until, end)
    first = intervals[0][0] - launched
    after = max(0.0, exited - covered_until)
    return {
        "start_to_first_stage_s": first,
        "between_stages_s": between,
        "after_last_stage_s": after,
        "outside_stages_s": first + between + after,
        "job_wall_s": exited - launched,
    }


def model_choice(overrides: list[str]) -> str:
    """The ``model`` config the bench runs (its ``model=`` override, else the default)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["calibration=pydoc", *overrides], return_hydra_config=True)
    return cfg.hydra.runtime.choices.model


def fixed_cost(overrides: list[str], forward_s: float) -> dict:
    """The fixed cost of a job on the bench's model, as seconds and as ratios to ``forward_s``."""
    job = [
        "debug=smoke",
        f"model={model_choice(overrides)}",
        "tracking.wandb.mode=offline",
        "tracking.codecarbon.enabled=true",
        "eval.samples=null",  # greedy generation is a stage's work, not a fixed cost
        *(o for o in overrides if o.split("=", 1)[0].lstrip("+~").startswith(("model.", "tracking.", "protocol"))),
    ]
    seconds = {
        "import_torch_s": import_seconds(module="torch"),
        "import_job_s": import_seconds(),
        **job_fixed_cost(job),
    }
    out = {"fixed_cost_job": " ".join(job)}
    for key, value in seconds.items():
        out[key] = round(value, 3)
    for key in ("import_job", "start_to_first_stage", "outside_stages"):
        out[f"{key}_over_forward"] = round(seconds[f"{key}_s"] / forward_s, 3)
        out[f"{key}_over_import_torch"] = round(seconds[f"{key}_s"] / seconds["import_torch_s"], 3)
    print(
        f"fixed cost ({out['fixed_cost_job']}): import torch {seconds['import_torch_s']:.2f} s, "
        f"import run.py's modules {seconds['import_job_s']:.2f} s "
        f"({out['import_job_over_forward']}x forward); launch to first stage {seconds['start_to_first_stage_s']:.2f} s "
        f"({out['start_to_first_stage_over_forward']}x); outside stages {seconds['outside_stages_s']:.2f} s "
        f"({out['outside_stages_over_forward']}x: {seconds['between_stages_s']:.2f} s between stages, "
        f"{seconds['after_last_stage_s']:.2f} s after the last) of {seconds['job_wall_s']:.1f} s",
        flush=True,
    )
    return out


def pruning_speed(model, cuts, transform, settings) -> dict:
    """The unpruned ``model`` against two pruned copies (plain removal of ``cuts``; the same with
    ``transform`` as a separate T after the block before the first cut), measured alternately:
    speedups with their per-round ranges, memory / parameter / checkpoint ratios, the unpruned
    throughputs and the settings, as flat keys."""
    plain, separate = copy.deepcopy(model), copy.deepcopy(model)
    prune(adapter_for(plain), cuts, {cut: None for cut in cuts})
    prune(adapter_for(separate), cuts, {cuts[0]: transform}, placement="separate")
    started = time.perf_counter()
    comparison = compare_speed({"unpruned": model, "plain": plain, "separate": separate}, settings)
    seconds = time.perf_counter() - started
    out = dict(comparison.settings, speed_seconds=round(seconds, 1))
    base = comparison.models["unpruned"]
    for metric in METRICS:
        out[f"speed_{metric}_tok_s"] = round(base.tok_s(metric), 2)
    for kind in ("plain", "separate"):
        row = comparison.row(kind, "unpruned")
        for metric in METRICS:
            for suffix in ("speedup", "speedup_min", "speedup_max"):
                out[f"speed_{kind}_{metric}_{suffix}"] = round(row[f"speed_{metric}_{suffix}"], 3)
        for ratio in ("peak_infer_mem_ratio", "param_count_ratio", "checkpoint_bytes_ratio"):
            value = row[ratio]
            out[f"speed_{kind}_{ratio}"] = round(value, 4) if value is not None else None
        print(
            f"speed, {kind} ({adapter_for(plain).num_layers} of {adapter_for(model).num_layers} blocks) against "
            f"unpruned: prefill {row['speed_prefill_speedup']:.2f}x "
            f"[{row['speed_prefill_speedup_min']:.2f}, {row['speed_prefill_speedup_max']:.2f}], "
            f"decode batch 1 {row['speed_decode_b1_speedup']:.2f}x "
            f"[{row['speed_decode_b1_speedup_min']:.2f}, {row['speed_decode_b1_speedup_max']:.2f}], "
            f"decode batch {settings.batch} {row['speed_decode_batch_speedup']:.2f}x "
            f"[{row['speed_decode_batch_speedup_min']:.2f}, {row['speed_decode_batch_speedup_max']:.2f}]; "
            f"peak memory x{out[f'speed_{kind}_peak_infer_mem_ratio']}, parameters x{row['param_count_ratio']:.3f}, "
            f"checkpoint x{row['checkpoint_bytes_ratio']:.3f}",
            flush=True,
        )
    print(f"speed: {seconds:.1f} s for the three models", flush=True)
    return out


def lm_eval_scoring(model, tokenizer, batches, rounds: int = 3) -> dict:
    """lm-eval's HFLM against the project's harness model on the same multiple-choice shaped
    requests, alternately: the ratio of their times (see the module docstring)."""
    import random

    from lm_eval.models.huggingface import HFLM

    from replaceme_exp.evaluation.harness import progress_lm_class

    rng = random.Random(0)
    tokens = [t for batch in batches for t in batch.input_ids[batch.attention_mask.bool()].tolist()]
    requests = []
    for _ in range(64):
        start, length = rng.randrange(0, len(tokens) - 200), rng.randrange(40, 121)
        context = tokens[start : start + length]
        for _ in range(4):
            continuation = [tokens[rng.randrange(len(tokens))] for _ in range(rng.randrange(1, 5))]
            requests.append((("", ""), context, continuation))
    lms = {
        name: cls(pretrained=model, tokenizer=tokenizer, batch_size=8, max_length=512)
        for name, cls in (("hflm", HFLM), ("scored", progress_lm_class()))
    }
    times = {name: [] for name in lms}
    scores = {}
    for _ in range(rounds):
        for name, lm in lms.items():
            started = time.perf_counter()
            scores[name] = lm._loglikelihood_tokens(requests, disable_tqdm=True)
            times[name].append(time.perf_counter() - started)
    for (a, _), (b, _) in zip(scores["hflm"], scores["scored"]):
        assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (a, b)
    ratios = sorted(h / s for h, s in zip(times["hflm"], times["scored"]))
    out = {
        "lm_eval_requests": len(requests),
        "lm_eval_hflm_s": round(sorted(times["hflm"])[rounds // 2], 3),
        "lm_eval_scored_positions_s": round(sorted(times["scored"])[rounds // 2], 3),
        "lm_eval_scored_positions_speedup": round(ratios[rounds // 2], 3),
        "lm_eval_scored_positions_speedup_min": round(ratios[0], 3),
        "lm_eval_scored_positions_speedup_max": round(ratios[-1], 3),
    }
    print(
        f"lm-eval, {len(requests)} requests: HFLM {out['lm_eval_hflm_s']:.2f} s, head on the scored positions "
        f"{out['lm_eval_scored_positions_s']:.2f} s ({out['lm_eval_scored_positions_speedup']}x "
        f"[{ratios[0]:.2f}, {ratios[-1]:.2f}])",
        flush=True,
    )
    return out


SECTIONS = ("capture", "statistics", "layerwise", "cosine", "ls_memory", "startup", "speed", "lm_eval")


def parse_args(argv: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """(Hydra overrides, the sections to run): ``--only capture,startup`` (or ``--only=...``) runs
    those sections of :data:`SECTIONS` alone; the plain forward pass, their denominator, always runs."""
    overrides, sections, args = [], SECTIONS, list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--only" or arg.startswith("--only="):
            value = arg.split("=", 1)[1] if "=" in arg else (args.pop(0) if args else "")
            sections = tuple(name.strip() for name in value.split(",") if name.strip())
            if not sections or set(sections) - set(SECTIONS):
                raise SystemExit(f"--only={value!r}: choose one or more of {', '.join(SECTIONS)}, comma-separated")
        else:
            overrides.append(arg)
    return overrides, sections


class Bench:
    """What every section measures on: the model, the calibration batches, the candidate cuts, the
    plain forward pass's seconds and, once measured, the selected cuts."""

    def __init__(self, overrides: list[str]):
        self.overrides = overrides
        self.spec = JobSpec.from_config(config(overrides))
        self.cfg = cfg = self.spec.config
        self.loaded = load_model(cfg.model, str(ROOT / ".cache"))
        self.adapter = adapter = adapter_for(self.loaded.model)
        self.batches = build_calibration(cfg.calibration, self.loaded.tokenizer)
        length = cut_length(cfg.n_prune, cfg.num_lts, adapter.num_layers)
        self.candidates = candidate_cuts(adapter.num_layers, length)
        self.device = adapter.backbone.embed_tokens.weight.device
        self.cuts = None
        print(
            f"model {cfg.model.name}: {adapter.num_layers} blocks, hidden {adapter.hidden_size}; "
            f"{self.batches.n_tokens} calibration tokens in {len(self.batches)} batches; "
            f"{len(self.candidates)} candidate cuts",
            flush=True,
        )
        plain_forward(adapter, self.batches)  # warm-up
        self.forward_s, _ = timed(lambda: plain_forward(adapter, self.batches))
        print(f"plain forward: {self.forward_s:.2f} s", flush=True)

    def one_pass(self, execution=None):
        dist = CutDistances(self.candidates)
        stats = LinearStatistics(self.candidates, self.adapter.hidden_size, self.device)
        run_capture(self.adapter, self.batches, [dist, stats], execution=execution)
        return select_cuts(dist.result(), self.cfg.num_lts, True)

    def job_pass(self, drop_candidates: bool = True):
        """The default job's selection and statistics as the job runs them with one pass
        (:func:`select_and_capture`; ``drop_candidates``: candidates out of the running stop
        gathering statistics, ``capture.drop_candidates``). Returns the cuts and whether the selected
        cut needed a second pass."""
        request = dataclasses.replace(self.spec.selection_request(), passes="one", drop_candidates=drop_candidates)
        cache = StatisticsCache(tempfile.gettempdir(), "bench", "bench", enabled=False)
        labels = []

        @contextlib.contextmanager
        def kept(kind, label):
            labels.append(label)
            yield

        with observed_by(kept):
            selection = select_and_capture(request, self.adapter, self.batches, cache, needs_stats=True)
        return selection.cuts, "capture (statistics)" in labels

    def two_passes(self):
        dist = CutDistances(self.candidates)
        run_capture(self.adapter, self.batches, [dist])
        cuts = select_cuts(dist.result(), self.cfg.num_lts, True)
        run_capture(self.adapter, self.batches, [LinearStatistics(cuts, self.adapter.hidden_size, self.device)])
        return cuts

    def selected(self):
        """The selected cuts (one distances-only pass when the capture section did not run)."""
        if self.cuts is None:
            dist = CutDistances(self.candidates)
            run_capture(self.adapter, self.batches, [dist])
            self.cuts = select_cuts(dist.result(), self.cfg.num_lts, True)
        return self.cuts


CAPTURE_ROUNDS = 3  # rounds of (plain forward, the job's capture, the capture of every candidate)


def capture_section(b: Bench) -> dict:
    """The job's capture against the plain forward pass, alternating in each of CAPTURE_ROUNDS rounds
    (so that a change of the machine's load moves both sides of a ratio): the median of the rounds'
    ratios, with their range."""
    rounds = []
    for i in range(CAPTURE_ROUNDS):
        forward_s, _ = timed(lambda: plain_forward(b.adapter, b.batches))
        if i == 0:  # once: the plan the job takes only when the statistics do not fit
            two_s, cuts_two = timed(b.two_passes)
            two_over_forward = two_s / forward_s
        racing_s, (cuts, second_pass) = timed(b.job_pass)
        full_s, (cuts_full, _) = timed(lambda: b.job_pass(drop_candidates=False))
        assert cuts == cuts_full == cuts_two
        rounds.append((racing_s / forward_s, full_s / forward_s))
        print(
            f"capture round: forward {forward_s:.2f} s, the job's one pass {racing_s:.2f} s (candidates out of the "
            f"running dropped; a second pass: {second_pass}), every candidate's statistics {full_s:.2f} s",
            flush=True,
        )
    b.cuts = cuts
    cfg, cache_dir = b.cfg, str(ROOT / ".cache")
    memory = model_memory(cfg.model, cache_dir)
    batch_size, seq_len = int(cfg.calibration.batch_size), int(cfg.calibration.seq_len)
    plan = plan_execution(cfg.capture, cfg.model, batch_size, seq_len, memory, cache_dir=cache_dir)
    auto_one = all_candidates_fit(b.spec.selection_request(plan), b.adapter.hidden_size, len(b.candidates))
    whole_peak = peak_live_bytes(b.one_pass, b.device) if b.device.type == "cuda" else None
    stats_bytes = len(b.candidates) * cut_stats_bytes(b.adapter.hidden_size)
    act_bytes = memory.forward_activations(batch_size, seq_len)
    b.plan_bytes = (memory.largest_block, act_bytes + stats_bytes)
    racing, full = sorted(r[0] for r in rounds), sorted(r[1] for r in rounds)
    job = racing if auto_one else [two_over_forward]
    return {
        "capture_passes_auto": "one" if auto_one else "two",
        "capture_rounds": CAPTURE_ROUNDS,
        "capture_over_forward": round(statistics.median(job), 3),
        "capture_over_forward_min": round(job[0], 3),
        "capture_over_forward_max": round(job[-1], 3),
        "capture_one_pass_over_forward": round(statistics.median(racing), 3),
        "capture_every_candidate_over_forward": round(statistics.median(full), 3),
        "capture_two_passes_over_forward": round(two_over_forward, 3),
        "capture_needed_second_pass": second_pass,
        "capture_plan": plan.reason,
        # GPU only: peak memory of the one-pass capture against what the plan counts for it
        "whole_peak_gib": round(whole_peak / 2**30, 3) if whole_peak is not None else None,
        "whole_planned_gib": round((act_bytes + stats_bytes) / 2**30, 3),
    }


def statistics_section(b: Bench) -> dict:
    def statistics_time(precision: str) -> float:
        stats = LinearStatistics(b.candidates, b.adapter.hidden_size, b.device, precision=precision)
        return timed(lambda: run_capture(b.adapter, b.batches, [stats]))[0]

    float64_s, float32_s = statistics_time("float64"), statistics_time("float32")
    print(f"statistics of every candidate: float64 {float64_s:.2f} s, float32 {float32_s:.2f} s", flush=True)
    cut = b.selected()[0]
    solve_stats = LinearStatistics([cut], b.adapter.hidden_size, b.device)
    run_capture(b.adapter, b.batches, [solve_stats])
    solve_s, b.cut_transform = timed(lambda: ridge_solve(solve_stats.result()[cut], 0.0), repeats=3)
    return {
        "statistics_float64_over_forward": round(float64_s / b.forward_s, 3),
        "statistics_float32_over_forward": round(float32_s / b.forward_s, 3),
        "statistics_float32_over_float64": round(float32_s / float64_s, 3),
        "ls_solve_s": round(solve_s, 4),
    }


def layerwise_section(b: Bench) -> dict:
    """The model in host memory, blocks one at a time on the compute device, against whole-model."""
    one_s = getattr(b, "one_s", None) or timed(b.one_pass)[0]
    b.loaded.model.to("cpu")
    layerwise = CaptureExecution(mode="layerwise", device=b.device)
    layerwise_s, cuts_layerwise = timed(lambda: b.one_pass(layerwise))
    layerwise_peak = peak_live_bytes(lambda: b.one_pass(layerwise), b.device) if b.device.type == "cuda" else None
    b.loaded.model.to(b.device)
    assert cuts_layerwise == b.selected()
    print(f"layer-wise capture, one pass: {layerwise_s:.2f} s", flush=True)
    memory = model_memory(b.cfg.model, str(ROOT / ".cache"))
    act_bytes = memory.forward_activations(int(b.cfg.calibration.batch_size), int(b.cfg.calibration.seq_len))
    stats_bytes = len(b.candidates) * cut_stats_bytes(b.adapter.hidden_size)
    return {
        "capture_layerwise_over_whole": round(layerwise_s / one_s, 3),
        "layerwise_peak_gib": round(layerwise_peak / 2**30, 3) if layerwise_peak is not None else None,
        "layerwise_planned_gib": round((memory.largest_block + act_bytes + stats_bytes) / 2**30, 3),
    }


def ls_memory_section(b: Bench) -> dict:
    (tokens_1x, peak_1x), (tokens_4x, peak_4x) = (
        ls_path_peak(b.adapter, b.loaded.tokenizer, b.cfg, n, seq_len=128) for n in (48, 4 * 48)
    )
    print(
        f"LS path peak: {peak_1x / 2**20:.1f} MiB with {tokens_1x} tokens, {peak_4x / 2**20:.1f} MiB with {tokens_4x}",
        flush=True,
    )
    return {
        "ls_mem_tokens_1x": tokens_1x,
        "ls_mem_tokens_4x": tokens_4x,
        "ls_peak_mem_mb_1x": round(peak_1x / 2**20, 2),
        "ls_peak_mem_mb_4x": round(peak_4x / 2**20, 2),
        "ls_peak_mem_ratio_4x_data": round(peak_4x / peak_1x, 3),
    }


def speed_section(b: Bench) -> dict:
    if not b.cfg.eval.speed.enabled:
        return {}
    cuts = b.selected()
    if not hasattr(b, "cut_transform"):
        stats = LinearStatistics(cuts[:1], b.adapter.hidden_size, b.device)
        run_capture(b.adapter, b.batches, [stats])
        b.cut_transform = ridge_solve(stats.result()[cuts[0]], 0.0)
    return pruning_speed(b.loaded.model, cuts, b.cut_transform, b.cfg.eval.speed)


SECTION_RUNS = {
    "capture": capture_section,
    "statistics": statistics_section,
    "layerwise": layerwise_section,
    "cosine": lambda b: cosine_solvers(b.adapter, b.loaded.tokenizer, b.cfg, b.batches, b.selected()[0]),
    "ls_memory": ls_memory_section,
    "startup": lambda b: fixed_cost(b.overrides, b.forward_s),
    "speed": speed_section,
    "lm_eval": lambda b: lm_eval_scoring(b.loaded.model, b.loaded.tokenizer, b.batches),
}


def main(argv):
    overrides, sections = parse_args(argv)
    b = Bench(overrides)
    device = b.device
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu x{torch.get_num_threads()}",
        "model": b.cfg.model.name,
        "calib_tokens": b.batches.n_tokens,
        "forward_s": round(b.forward_s, 3),
        "sections": list(sections),
    }
    for name in SECTIONS:  # in this order whatever the order given: later sections reuse earlier results
        if name in sections:
            result.update(SECTION_RUNS[name](b))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
