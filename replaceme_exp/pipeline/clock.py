"""A job's clock: the wall time, energy and emissions of every stage the job's code announces
(:func:`replaceme_exp.stages.stage`), logged as each stage starts and ends."""

from __future__ import annotations

import logging
import resource
import time
from contextlib import contextmanager
from typing import Callable

import torch

from replaceme_exp.stages import StageCost
from replaceme_exp.tracking.emissions import StageEmissions

log = logging.getLogger("replaceme_exp.job")


class StageClock:
    """Wall time per stage kind (summed over repeats: ``eval`` sums the evaluation passes) and per
    label (``baseline perplexity``, ``held-out distances``, ...), CodeCarbon's task per kind, and
    ``on_stage(label, seconds, energy_kwh)`` as each stage ends (the W&B run's stage log; the
    energy CodeCarbon booked to the stage, None without CodeCarbon). ``failed``: the innermost
    stage that raised."""

    def __init__(
        self,
        emissions: StageEmissions | None = None,
        on_stage: Callable[[str, float, float | None], None] | None = None,
    ):
        self.seconds: dict[str, float] = {}
        self.labelled: dict[str, float] = {}
        self.emissions = emissions or StageEmissions(enabled=False)
        self.on_stage = on_stage
        self.failed: str | None = None
        self.peaks_before: dict[str, tuple[float, float]] = {}  # kind -> (host, CUDA) peaks when it began

    @contextmanager
    def __call__(self, kind: str, label: str | None = None):
        name = label or kind
        if kind in APART_FROM_THE_JOBS_PEAK and kind not in self.peaks_before:
            self.peaks_before[kind] = peak_memory_gb(torch.device("cpu")), peak_memory_gb(torch.device("cuda"))
        log.info("stage %s ...", name)
        start = time.perf_counter()
        before = self.emissions.columns()
        energy_before = before.get(f"energy_kwh_{kind}", 0.0)
        co2_before = before.get(f"co2_kg_{kind}", 0.0)
        cost = StageCost()
        try:
            with self.emissions.stage(kind):
                yield cost
        except BaseException:
            self.failed = self.failed or name
            raise
        finally:
            elapsed = time.perf_counter() - start
            self.seconds[kind] = self.seconds.get(kind, 0.0) + elapsed
            self.labelled[name] = self.labelled.get(name, 0.0) + elapsed
            log.info("stage %s done in %.1f s", name, elapsed)
            after = self.emissions.columns()
            energy, co2 = after.get(f"energy_kwh_{kind}"), after.get(f"co2_kg_{kind}")
            cost.seconds = elapsed
            cost.energy_kwh = None if energy is None else energy - energy_before
            cost.co2_kg = None if co2 is None else co2 - co2_before
            if self.on_stage is not None:
                self.on_stage(name, elapsed, cost.energy_kwh)

    def columns(self, device: torch.device, healed: bool) -> dict:
        """Each stage's seconds, the capture / estimate / eval / heal / speed totals and the job's peak
        memory (up to the first stage of :data:`APART_FROM_THE_JOBS_PEAK`: the speed measurement's
        second copy of the model is not what the job needs)."""
        peak = peak_memory_gb(device)
        if self.peaks_before:
            host, cuda = min(self.peaks_before.values())
            peak = cuda if device.type == "cuda" else host
        return {
            "stage_seconds": dict(self.labelled),
            "time_capture_s": self.seconds.get("capture", 0.0),
            "time_estimate_s": self.seconds.get("estimate", 0.0),
            "time_eval_s": self.seconds.get("eval", 0.0),
            "time_heal_s": self.seconds.get("heal") if healed else None,
            "time_speed_s": self.seconds.get("speed"),
            "peak_mem_gb": peak,
        }


# Stages that measure what the pruned model buys beside a copy of the unpruned one: the job's peak
# memory is read before them.
APART_FROM_THE_JOBS_PEAK = ("speed",)


def peak_memory_gb(device: torch.device) -> float:
    """Peak CUDA memory allocated, summed over the GPUs (``device_map=auto`` spreads a model);
    on a CPU the peak resident memory of the process."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return 0.0
        return sum(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
