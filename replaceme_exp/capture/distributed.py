"""One job over several processes: the ranks, their process group and the collectives of a capture.

``torchrun --nproc-per-node N run.py ...`` (or ``srun`` with several tasks) starts N copies of the
job. :func:`ranks_from_env` reads who is who from the environment; :func:`start` joins the process
group (gloo on CPU, NCCL when the job computes on a GPU) with a timeout on every collective
(``capture.timeout_s``), so a rank that dies fails the others instead of leaving them waiting.

Inside :func:`sharing` (the job's calibration captures) every capture runs over this rank's block of
consecutive batches (:func:`shard`: rank r takes the r-th contiguous block, so the ranks' blocks laid
end to end in rank order are the batches in their order) and merges its statistics with the other
ranks' (:mod:`replaceme_exp.capture.merge`). Outside it, and without a process group, a capture runs
over every batch as in a one-process job.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

DEFAULT_PORT = 29500
# Test-only fault injection: REPLACEME_TEST_RANK_EXIT=<rank> makes that rank exit (code 17) at the
# first batch of its first shared capture, as a rank that dies mid-capture.
FAULT_ENV = "REPLACEME_TEST_RANK_EXIT"
FAULT_EXIT_CODE = 17


@dataclass(frozen=True)
class Ranks:
    """This process's place in a job of ``world_size`` processes: ``rank`` (0 writes the row),
    ``local_rank`` (its GPU on its node), where rank 0 listens (``master_addr``, ``master_port``)
    and who started the processes (``launcher``: ``torchrun`` or ``srun``)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str

    @property
    def label(self) -> str:
        """``[rank r/N]``: what each of this rank's log lines starts with."""
        return f"[rank {self.rank}/{self.world_size}]"


class CollectiveFailed(RuntimeError):
    """A collective of the ranks failed: a rank died, or did not answer within the timeout."""


def slurm_first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[01-04]``), as ``scontrol show hostnames`` expands it."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    hosts = out.stdout.split()
    if out.returncode != 0 or not hosts:
        raise RuntimeError(f"scontrol show hostnames {nodelist} failed: {out.stderr.strip() or 'no host'}")
    return hosts[0]


def ranks_from_env(env: dict | None = None, first_host=slurm_first_host) -> Ranks | None:
    """The ranks of this process from the environment, None for a one-process job.

    torchrun: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``.
    srun (no ``WORLD_SIZE``): ``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_LOCALID``; rank 0's address
    is ``MASTER_ADDR`` when set, else ``SLURM_LAUNCH_NODE_IPADDR``, else the first host of
    ``SLURM_JOB_NODELIST`` (``first_host``: ``scontrol show hostnames``); the port ``MASTER_PORT``
    when set, else under srun 20000 + ``SLURM_JOB_ID`` mod 20000 (one per job), else 29500. One task
    (``SLURM_NTASKS=1``: a sweep's job under SLURM) is one process."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        rank, local = int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0))
        launcher = "torchrun"
    elif "SLURM_NTASKS" in env and "SLURM_PROCID" in env:
        world = int(env["SLURM_NTASKS"])
        rank, local = int(env["SLURM_PROCID"]), int(env.get("SLURM_LOCALID", 0))
        launcher = "srun"
    else:
        return None
    if world <= 1:
        return None
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world} processes")
    address = env.get("MASTER_ADDR")
    if address is None and launcher == "srun":
        address = env.get("SLURM_LAUNCH_NODE_IPADDR") or (
            first_host(env["SLURM_JOB_NODELIST"]) if env.get("SLURM_JOB_NODELIST") else None
        )
    port = int(env.get("MASTER_PORT", DEFAULT_PORT))
    if "MASTER_PORT" not in env and launcher == "srun" and env.get("SLURM_JOB_ID", "").isdigit():
        port = 20000 + int(env["SLURM_JOB_ID"]) % 20000  # two jobs of several tasks on one node: two ports
    return Ranks(rank, world, local, address or "127.0.0.1", port, launcher)


@dataclass
class _Session:
    ranks: Ranks
    backend: str
    timeout_s: float
    device: torch.device
    sharing: bool = False
    announced: bool = False


_session: _Session | None = None


def start(ranks: Ranks, timeout_s: float, cuda: bool) -> None:
    """Join the job's process group: NCCL with ``cuda`` (this rank on GPU ``local_rank``), else gloo;
    every collective fails after ``timeout_s`` seconds without an answer."""
    global _session
    import torch.distributed as dist

    if cuda:
        torch.cuda.set_device(ranks.local_rank)
    os.environ.setdefault("MASTER_ADDR", ranks.master_addr)
    os.environ.setdefault("MASTER_PORT", str(ranks.master_port))
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=datetime.timedelta(seconds=float(timeout_s)),
    )
    device = torch.device("cuda", ranks.local_rank) if cuda else torch.device("cpu")
    _session = _Session(ranks, backend, float(timeout_s), device)
    log.info("joined the process group (%s, collective timeout %g s)", backend, timeout_s)


def stop() -> None:
    """Leave the process group (idempotent)."""
    global _session
    import torch.distributed as dist

    if _session is not None and dist.is_initialized():
        dist.destroy_process_group()
    _session = None


def ranks() -> Ranks | None:
    """This process's ranks when it joined a process group, else None."""
    return _session.ranks if _session is not None else None


def is_leader() -> bool:
    """Whether this process writes the job's row: rank 0, or the only process."""
    return _session is None or _session.ranks.rank == 0


@contextmanager
def sharing():
    """Inside the block, captures are split over the ranks and merged (no-op without a process group)."""
    if _session is None:
        yield
        return
    _session.sharing = True
    try:
        yield
    finally:
        _session.sharing = False


def shared() -> Ranks | None:
    """The ranks a capture is split over now (inside :func:`sharing`), else None."""
    return _session.ranks if _session is not None and _session.sharing else None


def shard_bounds(n_batches: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[lo, hi)``: rank ``rank``'s block of consecutive batches (block sizes differ by at most one)."""
    return rank * n_batches // world_size, (rank + 1) * n_batches // world_size


def shard(batches: list, ranks: Ranks) -> tuple[list, int]:
    """This rank's block of ``batches`` and the sequences of the batches before it."""
    lo, hi = shard_bounds(len(batches), ranks.rank, ranks.world_size)
    before = sum(int(batch.attention_mask.shape[0]) for batch in batches[:lo])
    return list(batches[lo:hi]), before


def injected_fault(ranks: Ranks) -> None:
    """Test-only: exit at once when :data:`FAULT_ENV` names this rank (a rank dying mid-capture)."""
    if os.environ.get(FAULT_ENV) == str(ranks.rank):
        log.error("%s exits mid-capture (%s)", ranks.label, FAULT_ENV)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)


@contextmanager
def collective(what: str):
    """Turn a failed collective into one line: which, and the likely reason (a rank lost, the timeout)."""
    try:
        yield
    except CollectiveFailed:
        raise
    except (RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        first = re.sub(r"^\[[^\]]*\]\s*", "", first)  # gloo's source location
        timeout = _session.timeout_s if _session is not None else None
        raise CollectiveFailed(
            f"{what}: another rank died or did not answer within capture.timeout_s={timeout:g} ({first[:120]})"
        ) from err


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` where the backend moves it (NCCL: on this rank's GPU)."""
    return tensor.to(_session.device) if _session.backend == "nccl" else tensor


def all_reduce_sum(tensor: torch.Tensor, what: str = "merging statistics") -> None:
    """``tensor`` (float64 or integer) becomes the sum of every rank's, in place."""
    import torch.distributed as dist

    with collective(what):
        wire = _wire(tensor)
        dist.all_reduce(wire, op=dist.ReduceOp.SUM)
        if wire is not tensor:
            tensor.copy_(wire)


def sum_numbers(values: list, what: str = "merging statistics") -> list:
    """Every rank's ``values`` (floats or ints) summed element-wise: floats in float64, ints as int64."""
    if not values:
        return []
    as_int = all(isinstance(v, int) for v in values)
    tensor = torch.tensor(values, dtype=torch.int64 if as_int else torch.float64)
    all_reduce_sum(tensor, what)
    return [int(v) for v in tensor.tolist()] if as_int else tensor.tolist()


def counts_of_ranks(count: int, what: str = "gathering tokens") -> list[int]:
    """Every rank's ``count``, in rank order."""
    r = _session.ranks
    one_hot = [0] * r.world_size
    one_hot[r.rank] = int(count)
    return sum_numbers(one_hot, what)


def rows_to_leader(tensor: torch.Tensor, counts: list[int], what: str = "gathering tokens") -> None:
    """Rank r's first ``counts[r]`` rows of ``tensor`` (n, ...) land on rank 0 at rows
    ``sum(counts[:r]) ..``, after its own (which stay in place); the other ranks' ``tensor`` is
    unchanged. Bytes move as they are (bfloat16 as 16-bit integers)."""
    import torch.distributed as dist

    r = _session.ranks
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    with collective(what):
        if r.rank == 0:
            for source in range(1, r.world_size):
                block = tensor[offsets[source] : offsets[source] + counts[source]]
                if counts[source]:
                    wire = _wire(_bits(block).clone())
                    dist.recv(wire, src=source)
                    _bits(block).copy_(wire.to(block.device))
        elif counts[r.rank]:
            dist.send(_wire(_bits(tensor[: counts[r.rank]]).contiguous()), dst=0)
        dist.barrier()


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a dtype every backend moves (16-bit floats as int16)."""
    return tensor.view(torch.int16) if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


def from_leader(value, what: str):
    """Rank 0's ``value`` (any picklable object) on every rank."""
    import torch.distributed as dist

    box = [value]
    with collective(what):
        dist.broadcast_object_list(box, src=0, device=_session.device if _session.backend == "nccl" else None)
    return box[0]


def announce(message: dict | None) -> bool:
    """Rank 0 tells the other ranks, once, whether the job runs (``message``: what they need to run
    it, e.g. the weights' fingerprint) or stops before any capture (None: refused, skipped as
    finished, failed before its stages); later calls do nothing. The other ranks'
    :func:`leader_says` returns it. Returns whether this call told them."""
    if _session is None or _session.announced or _session.ranks.rank != 0:
        return False
    _session.announced = True
    from_leader(message, "telling the other ranks whether the job runs")
    return True


def leader_says() -> dict | None:
    """On a rank other than 0: what rank 0 announced (None: it runs no job)."""
    return from_leader(None, "waiting for rank 0 to start the job")


def same_on_every_rank(value: str, what: str) -> None:
    """Fail on every rank when ``value`` (a hash) is not rank 0's on every rank."""
    leader = from_leader(value, what)
    differs = sum_numbers([int(leader != value)], what)[0]
    if differs:
        raise CollectiveFailed(f"{what}: {differs} rank(s) differ from rank 0 ({leader})")
