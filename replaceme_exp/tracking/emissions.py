"""Energy (kWh) and CO2 (kg) of each stage of a job, from one offline CodeCarbon tracker with one
task per stage (no network), and how each number was obtained.

CodeCarbon measures a device where it can read a counter (RAPL or the Windows energy interface for
the CPU, NVML / AMD SMI for GPUs, powermetrics on Apple silicon) and otherwise *estimates* it: the
CPU from its TDP (or a generic one) times the load, the RAM from its size. With
``tracking_mode="process"`` an estimate is this process's share (its CPU time, its resident memory)
instead of the whole machine's, so parallel jobs on one machine do not each book all of it; a
measured counter (RAPL, NVML) still covers its whole device. :meth:`StageEmissions.columns` says
which, per device (``energy_power``), and whether any part is estimated (``energy_estimated``)."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from pathlib import Path

from replaceme_exp.errors import ConfigError

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


# CodeCarbon's CPU modes that read an energy counter, and what reads it.
MEASURED_CPU_MODES = {
    "intel_rapl": "RAPL",
    "windows_emi": "Windows energy meter (RAPL)",
    "intel_power_gadget": "Intel Power Gadget",
    "apple_powermetrics": "powermetrics",
}


def power_sources(hardware: list, tracking_mode: str) -> dict[str, str]:
    """``{device: how its power is obtained}`` for CodeCarbon's detected ``hardware`` (``cpu``,
    ``ram``, ``gpu``), each starting with ``measured`` or ``estimated``: e.g. ``{"cpu":
    "estimated: TDP 8 W x this process's CPU time", "ram": "estimated: from this process's
    resident memory"}``."""
    share = tracking_mode == "process"
    out: dict[str, str] = {}
    for device in hardware:
        kind = type(device).__name__
        chip = str(getattr(device, "chip_part", "")).lower()
        if kind == "CPU":
            mode = getattr(device, "_mode", None)
            if mode in MEASURED_CPU_MODES:
                whole = " (the whole package, not this process)" if share else ""
                out["cpu"] = f"measured: {MEASURED_CPU_MODES[mode]}{whole}"
            else:
                tdp = getattr(device, "_tdp", None)
                generic = " (generic)" if getattr(device, "_is_generic_tdp", False) else ""
                load = "this process's CPU time" if share and mode == "cpu_load" else "the machine's CPU load"
                rule = f"x {load}" if mode == "cpu_load" else "constant"
                out["cpu"] = f"estimated: TDP {tdp} W{generic} {rule}"
        elif kind == "RAM":
            given = getattr(device, "_force_ram_power", None)
            memory = "this process's resident memory" if share else "the machine's memory size"
            out["ram"] = f"estimated: {given} W given" if given is not None else f"estimated: from {memory}"
        elif kind == "GPU":
            out["gpu"] = "measured: NVML / AMD SMI (whole GPUs of codecarbon_gpu_ids)"
        elif kind in ("AppleSiliconChip", "Raspberry"):
            out[chip or kind.lower()] = f"measured: {'powermetrics' if kind == 'AppleSiliconChip' else 'PMIC'}"
    return out


def check_region(country_iso_code: str, region: str | None) -> None:
    """Refuse a ``region`` CodeCarbon has no grid data for in ``country_iso_code`` (it would log an
    error at every stage and silently use the country's average)."""
    if region is None:
        return
    from codecarbon.core.emissions import DataSourceException
    from codecarbon.input import DataSource

    try:
        regions = DataSource().get_country_emissions_data(country_iso_code.lower())
    except (DataSourceException, OSError, KeyError):
        raise ConfigError(
            "tracking.codecarbon.region", region, f"CodeCarbon has no regional grid data for {country_iso_code}"
        ) from None
    if region.lower() not in regions:
        known = ", ".join(sorted(regions)[:6])
        reason = f"not a region of {country_iso_code} (e.g. {known}, ...)"
        raise ConfigError("tracking.codecarbon.region", region, reason)


class StageEmissions:
    def __init__(
        self,
        enabled: bool,
        country_iso_code: str = "USA",
        output_dir: str | os.PathLike = ".",
        gpu_ids: list | None = None,
        region: str | None = None,
        tracking_mode: str = "process",
    ):
        self.gpu_ids = gpu_ids
        self.country_iso_code, self.region, self.tracking_mode = country_iso_code, region, tracking_mode
        self.energy_kwh: dict[str, float] = {}
        self.co2_kg: dict[str, float] = {}
        self.tracker = None
        self.output_dir = Path(output_dir)
        self._warm_up: _HardwareSetup | None = None
        if not enabled:
            return
        from codecarbon import OfflineEmissionsTracker

        check_region(country_iso_code, region)
        logging.getLogger("codecarbon").setLevel(logging.ERROR)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self.tracker = OfflineEmissionsTracker(
            country_iso_code=country_iso_code,
            tracking_mode=tracking_mode,
            **({"region": region.lower()} if region is not None else {}),
            output_dir=str(output_dir),
            project_name="replaceme-exp",
            log_level="error",
            save_to_file=False,  # its CSV files are written when it stops (close)
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

    def columns(self) -> dict:
        """``energy_kwh_<stage>``, ``co2_kg_<stage>``, the totals ``energy_kwh``, ``co2_kg``, and how
        they were obtained: ``energy_tracking_mode`` (``process``: this job's share; ``machine``),
        ``energy_power`` (per device, :func:`power_sources`), ``energy_estimated`` (True when any
        device's power is estimated, not measured; None when CodeCarbon never set up its
        hardware), ``energy_country_iso_code`` and ``energy_region`` (the grid of the CO2). Empty
        when tracking is off: a missing measurement stays missing."""
        if self.tracker is None:
            return {}
        out = {f"energy_kwh_{k}": v for k, v in self.energy_kwh.items()}
        out.update({f"co2_kg_{k}": v for k, v in self.co2_kg.items()})
        out.update(energy_kwh=sum(self.energy_kwh.values()), co2_kg=sum(self.co2_kg.values()))
        sources = power_sources(getattr(self.tracker, "_hardware", None) or [], self.tracking_mode)
        out.update(
            energy_tracking_mode=self.tracking_mode,
            energy_power=sources or None,
            energy_estimated=any(v.startswith("estimated") for v in sources.values()) if sources else None,
            energy_country_iso_code=self.country_iso_code,
            energy_region=self.region,
        )
        return out

    def _write_files_on_stop(self) -> None:
        """Have the tracker's stop write CodeCarbon's CSV files (``emissions.csv``: the job's total;
        ``emissions_<experiment>_<run>.csv``: its stages) into ``output_dir``. The tracker is made
        without an output: with one, CodeCarbon imports every output it has (HTTP, Prometheus,
        Logfire: about 0.6 s of each job's start-up) and rewrites the files at every stage's end."""
        from codecarbon.output_methods.file import FileOutput

        handlers = getattr(self.tracker, "_output_handlers", None)
        if not isinstance(handlers, list):  # another CodeCarbon: the energy columns stay, the files do not
            log.warning("CodeCarbon's CSV files not written: this CodeCarbon has no output handlers to add to")
            return
        handlers.append(FileOutput("emissions.csv", str(self.output_dir), "append"))

    def close(self) -> None:
        if self.tracker is not None:
            try:
                self._hardware_ready()
                self._write_files_on_stop()
                self.tracker.stop()
            except Exception as err:  # noqa: BLE001 - tracking must not fail a finished job
                log.warning("CodeCarbon did not stop cleanly: %s", err)
