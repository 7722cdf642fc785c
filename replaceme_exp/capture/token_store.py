"""A memory-bounded store of per-token activations for the numerical objectives.

Only non-padding tokens are kept, in bfloat16, one (n_tokens, hidden) tensor per stored quantity,
allocated once for the exact number of tokens (never n_samples x max_len). The store lives on the
GPU when it fits there, else in pinned CPU memory, else in disk-backed (memory-mapped) files.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import torch

from replaceme_exp.storage import pid_alive

log = logging.getLogger(__name__)

LOCATIONS = ("auto", "gpu", "cpu", "disk")


def available_cpu_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TokenStore:
    """``names`` tensors of shape (n_tokens, hidden) in ``dtype``.

    ``location="auto"`` takes the GPU if ``compute_device`` is a GPU and the store fits in
    ``max_gpu_gb`` (default: half of the free GPU memory), else CPU memory if it fits in
    ``max_cpu_gb`` (default: half of the available memory; pinned when a GPU computes), else disk.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        n_tokens: int,
        hidden: int,
        compute_device: torch.device,
        location: str = "auto",
        max_gpu_gb: float | None = None,
        max_cpu_gb: float | None = None,
        directory: str | os.PathLike | None = None,
        dtype: torch.dtype = torch.bfloat16,
        owner: str = "",
    ):
        if location not in LOCATIONS:
            raise ValueError(f"store.location={location!r}: choose one of {LOCATIONS}")
        self.names, self.n_tokens, self.hidden, self.dtype = tuple(names), n_tokens, hidden, dtype
        self.owner = owner  # the config hash whose job made it: its next run removes leftovers
        self.compute_device = compute_device
        self.nbytes = len(self.names) * n_tokens * hidden * torch.tensor([], dtype=dtype).element_size()
        self.location = self._choose(location, max_gpu_gb, max_cpu_gb)
        self._tmpdir = None
        self.tensors: dict[str, torch.Tensor] = {}
        for name in self.names:
            self.tensors[name] = self._allocate(name, directory)
        log.info(
            "token store: %s x (%d tokens, %d hidden) %s = %.1f MiB in %s",
            len(self.names),
            n_tokens,
            hidden,
            str(dtype).replace("torch.", ""),
            self.nbytes / 2**20,
            self.location,
        )

    def _choose(self, location: str, max_gpu_gb: float | None, max_cpu_gb: float | None) -> str:
        if location != "auto":
            return location
        if self.compute_device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.compute_device)
            budget = max_gpu_gb * 2**30 if max_gpu_gb is not None else free / 2
            if self.nbytes <= budget:
                return "gpu"
        budget = max_cpu_gb * 2**30 if max_cpu_gb is not None else available_cpu_bytes() / 2
        return "cpu" if self.nbytes <= budget else "disk"

    def _allocate(self, name: str, directory) -> torch.Tensor:
        shape = (self.n_tokens, self.hidden)
        if self.location == "gpu":
            return torch.empty(shape, dtype=self.dtype, device=self.compute_device)
        if self.location == "cpu":
            return torch.empty(shape, dtype=self.dtype, pin_memory=torch.cuda.is_available())
        if self._tmpdir is None:
            prefix = f"token-store-{self.owner}-{os.getpid()}-"
            self._tmpdir = tempfile.TemporaryDirectory(prefix=prefix, dir=directory)
        path = Path(self._tmpdir.name) / f"{name}.bin"
        return torch.from_file(str(path), shared=True, size=self.n_tokens * self.hidden, dtype=self.dtype).view(shape)

    def write(self, name: str, offset: int, rows: torch.Tensor) -> None:
        """Store ``rows`` (n, hidden) at token positions ``offset .. offset+n-1``."""
        target = self.tensors[name]
        target[offset : offset + rows.shape[0]].copy_(rows.to(device=target.device, dtype=self.dtype))

    def truncate(self, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` rows (a token rule wrote fewer than were allocated)."""
        if not 0 <= n_tokens <= self.n_tokens:
            raise ValueError(f"cannot truncate a store of {self.n_tokens} tokens to {n_tokens}")
        self.n_tokens = n_tokens
        self.tensors = {name: tensor[:n_tokens] for name, tensor in self.tensors.items()}

    def rows(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The stored rows at ``indices`` (batch,), as float32 on the compute device."""
        out = {}
        for name, tensor in self.tensors.items():
            idx = indices.to(tensor.device)
            out[name] = tensor.index_select(0, idx).to(self.compute_device, non_blocking=True).float()
        return out

    @staticmethod
    def remove_leftovers(owner: str, directory: str | os.PathLike | None = None) -> int:
        """Remove the disk stores killed jobs of ``owner`` (a config hash) left: those whose process
        is gone (stores are named ``token-store-<owner>-<pid>-*``). Returns how many were removed."""
        import shutil

        root = Path(directory) if directory else Path(tempfile.gettempdir())
        removed = 0
        for leftover in root.glob(f"token-store-{owner}-*") if owner and root.is_dir() else []:
            pid = leftover.name[len(f"token-store-{owner}-") :].split("-")[0]
            if pid.isdigit() and pid_alive(int(pid)):  # a job of this config still running elsewhere
                continue
            shutil.rmtree(leftover, ignore_errors=True)
            removed += 1
        return removed

    def close(self) -> None:
        self.tensors.clear()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
