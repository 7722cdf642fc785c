"""How many threads torch computes with, decided per job of ``run.py``.

On a CPU shared with other work, torch's default (one thread per core) can be many times slower
than fewer threads: its threads wait for each other at every operation, and one of them waits for
a core another process holds. Measured on a 2-core machine (docs/guides/first-run.md, "Threads"):
with the other core busy, generating calibration answers took 8x longer on 2 threads than on 1;
on an idle machine 2 threads are faster. So the default is the cores that are idle at the job's
start (the cores minus the cores busy over a short look at ``/proc/stat``, at least 1; decided at
the first job of a process). Not the 1-minute load average: it lags by minutes, so a job started
just after another finished took 1 thread on an idle 2-core machine (163 s of capture where 2
threads take about half). ``REPLACEME_THREADS=n`` chooses n,
and an ``OMP_NUM_THREADS`` of the environment is left to torch, which follows it."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)


def idle_cores(cores: int, load: float) -> int:
    """The cores of ``cores`` that ``load`` (a load average) leaves idle, at least 1."""
    return max(1, min(cores, cores - round(load)))


def cpu_times(stat: str = "/proc/stat") -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs since boot, from ``/proc/stat``'s ``cpu`` line; None without it."""
    try:
        with open(stat) as file:
            fields = [float(v) for v in file.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def busy_cores(cores: int, seconds: float = 0.25, stat: str = "/proc/stat", sleep=time.sleep) -> float | None:
    """How many of ``cores`` other processes keep busy now: the busy share of all CPU time over
    ``seconds``, times ``cores``; None where ``/proc/stat`` cannot be read."""
    before = cpu_times(stat)
    sleep(seconds)
    after = cpu_times(stat)
    if before is None or after is None or after[1] <= before[1]:
        return None
    return cores * (after[0] - before[0]) / (after[1] - before[1])


def chosen_threads(environ=os.environ, cores: int | None = None, load: float | None = None) -> tuple[int | None, str]:
    """(threads, why): the number to set (None: leave torch's own) and the reason, in words."""
    given = environ.get("REPLACEME_THREADS")
    if given:
        try:
            threads = int(given)
        except ValueError:
            threads = 0
        if threads < 1:
            raise ValueError(f"REPLACEME_THREADS={given!r}: must be a positive integer")
        return threads, "REPLACEME_THREADS"
    if environ.get("OMP_NUM_THREADS"):
        return None, f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']}"
    cores = (
        cores
        if cores is not None
        else len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1
    )
    if load is None:
        load = busy_cores(cores)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # neither /proc/stat nor a load average on this system
            return None, "torch's default"
    return idle_cores(cores, load), f"{cores} cores, {load:.1f} busy; REPLACEME_THREADS=n to choose"


_decided: list[str] = []


def set_torch_threads() -> int:
    """Set torch's threads as :func:`chosen_threads` says, once per process (the later jobs of a
    sweep would count the load of the earlier ones), and log it (at debug level: a skipped job prints
    one line; the row's ``device`` column records the threads a job computed with); returns the number in use."""
    import torch

    if _decided:
        log.debug("torch threads: %d (%s)", torch.get_num_threads(), _decided[0])
        return torch.get_num_threads()
    threads, why = chosen_threads()
    _decided.append(why)
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    log.debug("torch threads: %d (%s)", torch.get_num_threads(), why)
    return torch.get_num_threads()
