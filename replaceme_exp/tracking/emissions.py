"""Energy (kWh) and CO2 (kg) of each stage of a job, from one offline CodeCarbon tracker with one
task per stage (no network; without RAPL or a GPU it estimates from the CPU's TDP and time)."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


def job_gpu_ids(device: str | None, device_map: str | None, cuda_available: bool, n_visible: int) -> list | None:
    """The physical ids of the GPUs a job computes on, for CodeCarbon's ``gpu_ids`` (it would
    otherwise measure every GPU of the node, or all of ``CUDA_VISIBLE_DEVICES``). ``device_map``
    spreads the model over every visible GPU; otherwise one device (``auto`` = GPU 0). Indices as
    torch sees them are mapped through ``CUDA_VISIBLE_DEVICES``. None without a GPU."""
    if not cuda_available or n_visible == 0:
        return None
    if device_map:
        local = list(range(n_visible))
    elif device in (None, "auto", "cuda"):
        local = [0]
    elif str(device).startswith("cuda:"):
        local = [int(str(device).split(":", 1)[1])]
    else:
        return None  # computing on the CPU
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return [int(ids[i]) if ids[i].isdigit() else ids[i] for i in local if i < len(ids)]
    return local


class _HardwareSetup(threading.Thread):
    """CodeCarbon's hardware detection, started in the background when the tracker is made: its
    CPU lookup waits about 1 s on a py-cpuinfo child process (on another core), which the job's own
    start-up (config, model plan) then overlaps instead of the first stage waiting for it.
    ``wait()`` joins it and raises what it raised, where ``start_task`` would have raised it."""

    def __init__(self, setup):
        super().__init__(name="codecarbon-hardware-setup", daemon=True)
        self.setup = setup
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.setup()
        except BaseException as err:  # noqa: BLE001 - raised again in the job's thread by wait()
            self.error = err

    def wait(self) -> None:
        self.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def _start_hardware_setup(tracker) -> _HardwareSetup | None:
    """The background hardware setup of ``tracker``; None when this CodeCarbon has no separate
    setup step (the first ``start_task`` then does it, as before)."""
    setup = getattr(tracker, "_ensure_hardware_ready", None)
    if setup is None:
        return None
    thread = _HardwareSetup(setup)
    thread.start()
    return thread


class StageEmissions:
    def __init__(
        self,
        enabled: bool,
        country_iso_code: str = "USA",
        output_dir: str | os.PathLike = ".",
        gpu_ids: list | None = None,
    ):
        self.gpu_ids = gpu_ids
        self.energy_kwh: dict[str, float] = {}
        self.co2_kg: dict[str, float] = {}
        self.tracker = None
        self._warm_up: _HardwareSetup | None = None
        if not enabled:
            return
        from codecarbon import OfflineEmissionsTracker

        logging.getLogger("codecarbon").setLevel(logging.ERROR)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self.tracker = OfflineEmissionsTracker(
            country_iso_code=country_iso_code,
            output_dir=str(output_dir),
            project_name="replaceme-exp",
            log_level="error",
            save_to_file=True,
            **({"gpu_ids": gpu_ids} if gpu_ids is not None else {}),
        )
        self._warm_up = _start_hardware_setup(self.tracker)

    def _hardware_ready(self) -> None:
        """Wait for the hardware setup started at construction (the first stage's ``start_task``
        would otherwise run it, inside that stage)."""
        if self._warm_up is not None:
            warm_up, self._warm_up = self._warm_up, None
            warm_up.wait()

    @contextmanager
    def stage(self, name: str):
        if self.tracker is None:
            yield
            return
        self._hardware_ready()
        self.tracker.start_task(name)
        try:
            yield
        finally:
            data = self.tracker.stop_task()
            if data is not None:
                self.energy_kwh[name] = self.energy_kwh.get(name, 0.0) + float(data.energy_consumed)
                self.co2_kg[name] = self.co2_kg.get(name, 0.0) + float(data.emissions)

    def columns(self) -> dict[str, float]:
        """``energy_kwh_<stage>``, ``co2_kg_<stage>`` and the totals ``energy_kwh``, ``co2_kg``
        (empty when tracking is off: a missing measurement stays missing)."""
        if self.tracker is None:
            return {}
        out = {f"energy_kwh_{k}": v for k, v in self.energy_kwh.items()}
        out.update({f"co2_kg_{k}": v for k, v in self.co2_kg.items()})
        out.update(energy_kwh=sum(self.energy_kwh.values()), co2_kg=sum(self.co2_kg.values()))
        return out

    def close(self) -> None:
        if self.tracker is not None:
            try:
                self._hardware_ready()
                self.tracker.stop()
            except Exception as err:  # noqa: BLE001 - tracking must not fail a finished job
                log.warning("CodeCarbon did not stop cleanly: %s", err)
