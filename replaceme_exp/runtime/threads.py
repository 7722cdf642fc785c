"""How many threads torch computes with, decided per job of ``run.py``.

On a CPU shared with other work, torch's default (one thread per core) can be many times slower
than fewer threads: its threads wait for each other at every operation, and one of them waits for
a core another process holds. Measured on a 2-core machine (docs/guides/first-run.md, "Threads"):
with the other core busy, generating calibration answers took 8x longer on 2 threads than on 1;
on an idle machine 2 threads are faster. So the default is the cores that are idle at the job's
start (the cores minus the 1-minute load average, at least 1; decided at the first job of a
process); ``REPLACEME_THREADS=n`` chooses n,
and an ``OMP_NUM_THREADS`` of the environment is left to torch, which follows it."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def idle_cores(cores: int, load: float) -> int:
    """The cores of ``cores`` that ``load`` (a load average) leaves idle, at least 1."""
    return max(1, min(cores, cores - round(load)))


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
    try:
        load = load if load is not None else os.getloadavg()[0]
    except OSError:  # no load average on this system
        return None, "torch's default"
    return idle_cores(cores, load), f"{cores} cores, load {load:.1f}; REPLACEME_THREADS=n to choose"


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
