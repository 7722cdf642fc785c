"""Captures split over gloo processes (torch.multiprocessing spawn), without a model: a synthetic
residual stream per token feeds the statistics as the capture hooks do. Imports torch, the capture
package and LinearPatch's accumulator only, so that a spawned rank starts in seconds."""

from __future__ import annotations

import socket

import torch

from replaceme_exp.capture import distributed
from replaceme_exp.estimation.linear_patch import ChannelScaleStatistics, channel_cosine_distance
from replaceme_exp.capture.accumulator import Accumulator
from replaceme_exp.capture.distributed import CollectiveFailed, Ranks
from replaceme_exp.capture.folds import FoldedLinearStatistics
from replaceme_exp.capture.hooks import BatchCapture, CaptureRequests
from replaceme_exp.capture.merge import capture_shared
from replaceme_exp.capture.similarity import SimilarityStatistics
from replaceme_exp.capture.statistics import (
    CutDistances,
    LayerDistances,
    LinearStatistics,
    TokenCollector,
    TransformDistances,
)
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.data.batching import TokenBatches, pad_sequences

LAYERS, HIDDEN, VOCAB = 6, 16, 64
CUTS = [(1, 3), (2, 4), (3, 5)]


def batches() -> TokenBatches:
    """7 right-padded batches of 3 sequences of 5 to 17 tokens (3 + 4 batches between 2 ranks)."""
    g = torch.Generator().manual_seed(4)
    lengths = torch.randint(5, 18, (21,), generator=g).tolist()
    sequences = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]
    return TokenBatches([pad_sequences(sequences[i : i + 3], 0, "right") for i in range(0, 21, 3)], 17)


def forward(statistics: list, data: TokenBatches) -> None:
    """Feed ``statistics`` as the hooks would: per block k, ``M_k = tanh(L_{k-1} W_k)`` then
    ``L_k = L_{k-1} + M_k``, from a fixed embedding of the token ids (the same on every process)."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(VOCAB, HIDDEN, generator=g)
    weights = [0.5 * torch.randn(HIDDEN, HIDDEN, generator=g) for _ in range(LAYERS)]
    plan = CaptureRequests(statistics, LAYERS)
    for batch in data:
        capture = BatchCapture(plan, batch, "cpu")
        hidden = table[batch.input_ids]
        for k, weight in enumerate(weights):
            mlp = torch.tanh(hidden @ weight)
            hidden = hidden + mlp
            capture.on_activation(("M", k), mlp)
            capture.on_activation(("L", k), hidden)
        capture.check_complete()


class ColumnSums(Accumulator):
    """A component's own statistic with the default merge (each tensor of its state summed over the ranks):
    the sum of ``L_2`` over the tokens and their count."""

    kind = "test_column_sums"

    def __init__(self):
        self.sums, self.count = torch.zeros(HIDDEN, dtype=torch.float64), torch.zeros((), dtype=torch.int64)

    def requests(self):
        return [((("L", 2),), self.update)]

    def update(self, acts, tokens) -> None:
        self.sums += acts[("L", 2)].double().sum(0)
        self.count += acts[("L", 2)].shape[0]

    def identity(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"sums": self.sums, "n_tokens": self.count}

    def restore(self, state: dict) -> None:
        self.sums, self.count = state["sums"], state["n_tokens"]

    def result(self):
        return self.sums, int(self.count)


def statistics_of(data: TokenBatches, split: bool = False) -> dict:
    """Every statistic over ``data`` (split over the ranks with ``split``), as tensors and numbers."""
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(1)
    transforms = {cut: torch.eye(HIDDEN) + 0.05 * torch.randn(HIDDEN, HIDDEN, generator=g) for cut in CUTS}
    stats = {
        "cut": CutDistances(CUTS),
        "last": CutDistances(CUTS, tokens="last"),
        "sequence": CutDistances(CUTS, sequence_distance=channel_cosine_distance),
        "layers": LayerDistances(LAYERS),
        "linear": LinearStatistics(CUTS, HIDDEN, cpu),
        "separate": LinearStatistics(CUTS, HIDDEN, cpu, placement="separate"),
        "folds": FoldedLinearStatistics(CUTS, HIDDEN, cpu, folds=3),
        "similarity": SimilarityStatistics(CUTS, HIDDEN, cpu),
        "channels": ChannelScaleStatistics(CUTS, HIDDEN, cpu, rotate=False),
        "heldout": TransformDistances(transforms),
        "declared": ColumnSums(),
    }
    store = TokenStore(("M", "R", "Y"), data.n_tokens, HIDDEN, cpu, location="cpu")
    collector = TokenCollector((2, 4), store)
    every = [*stats.values(), collector]
    if split:
        capture_shared(data, every, lambda mine, label: forward(every, mine))
    else:
        forward(every, data)
    out = {name: stats[name].result() for name in ("cut", "last", "sequence", "layers", "declared")}
    for name in ("linear", "separate"):
        out[name] = {cut: (s.mtm, s.mtr, s.r_sq, s.n_tokens) for cut, s in stats[name].result().items()}
    out["folds"] = {
        cut: [(f.mtm, f.mtr, f.r_sq, f.n_tokens) for f in s.folds] for cut, s in stats["folds"].result().items()
    }
    s = stats["similarity"]
    out["similarity"] = (s.sums, s.grams, s.cross, s.counts)
    out["channels"] = {cut: (c.ratio_sum, c.n_sequences, c.n_tokens) for cut, c in stats["channels"].result().items()}
    h = stats["heldout"]
    out["heldout"] = (h.result(), h.l2_result(), h.split_result())
    out["store"] = {name: t[: collector.offset].clone() for name, t in store.tensors.items()}
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture_on_rank(rank: int, world: int, port: int, folder: str) -> None:
    """Rank ``rank`` of ``world``: its share of the capture, merged, saved as ``folder/rank<r>.pt``."""
    torch.set_num_threads(1)
    distributed.start(Ranks(rank, world, rank, "127.0.0.1", port, "test"), 60, cuda=False)
    try:
        with distributed.sharing():
            found = statistics_of(batches(), split=True)
        torch.save(found, f"{folder}/rank{rank}.pt")
    finally:
        distributed.stop()


def dies_before_merging(rank: int, world: int, port: int, folder: str) -> None:
    """Rank 1 leaves at once (exit code 0, so that spawn does not stop rank 0 first); rank 0's sum
    then fails: its one-line error in ``folder/error.txt``."""
    distributed.start(Ranks(rank, world, rank, "127.0.0.1", port, "test"), 30, cuda=False)
    if rank == 1:
        import os

        os._exit(0)
    try:
        distributed.all_reduce_sum(torch.ones(4, dtype=torch.float64))
    except CollectiveFailed as err:
        with open(f"{folder}/error.txt", "w") as file:
            file.write(str(err))
    finally:
        distributed.stop()
