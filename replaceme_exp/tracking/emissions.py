"""Energy (kWh) and CO2 (kg) of each stage of a job, from one offline CodeCarbon tracker with one
task per stage (no network; without RAPL or a GPU it estimates from the CPU's TDP and time)."""

from __future__ import annotations

import logging
import os
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

    @contextmanager
    def stage(self, name: str):
        if self.tracker is None:
            yield
            return
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
                self.tracker.stop()
            except Exception as err:  # noqa: BLE001 - tracking must not fail a finished job
                log.warning("CodeCarbon did not stop cleanly: %s", err)
