"""A statistic that a component declares and the capture fills: an :class:`Accumulator`.

A selection metric, an estimator, a search or a healing step that needs something of the calibration
activations declares accumulators (for example :meth:`~replaceme_exp.estimation.estimators.Estimator.accumulators`)
instead of the pipeline knowing its kind. Each accumulator says

- where it reads: :meth:`~Accumulator.requests`, ``(keys, update)`` pairs over the capture's activation
  keys (:mod:`replaceme_exp.capture.statistics`: ``("L", k)`` the output of block ``k``, ``("M", k)`` its
  MLP's output, so ``L_{k-1}`` is what block ``k`` and its attention read, ``L_k - M_k`` what its MLP reads);
- what it holds: :meth:`~Accumulator.state`, named tensors (sums and counts), and :meth:`~Accumulator.restore`
  from them;
- how it merges across the ranks that split the batches: by default every tensor of its state is summed
  (:meth:`~Accumulator.merge`); a state that is not a sum overrides it;
- its cache entry (it is a :class:`~replaceme_exp.capture.entry.CacheEntry`): :attr:`~Accumulator.kind` and
  :attr:`~Accumulator.version` (bump the version when what it holds changes) and :meth:`~Accumulator.identity`,
  what tells its entry from another's of the same kind over the same model and data.

:func:`~replaceme_exp.capture.runner.gather` serves what a cache holds and captures the rest in one pass.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from replaceme_exp.capture import distributed
from replaceme_exp.capture.entry import CacheEntry
from replaceme_exp.capture.statistics import Request


class Accumulator(CacheEntry):
    """A statistic over calibration batches that knows where it reads, what it holds, how it merges and
    under which cache key it is kept (module docstring)."""

    takes_padding: ClassVar[bool] = False  # padded positions are not data

    def requests(self) -> list[Request]:
        """``(keys, update)`` pairs: ``update(acts, tokens)`` once per batch with ``acts[key]``
        (n_tokens, hidden) for each of ``keys``."""
        raise NotImplementedError

    def token_count(self) -> int:
        """The calibration tokens it accumulated over (its state's ``n_tokens``; 0 without one)."""
        return int(self.state().get("n_tokens", torch.tensor(0)))

    def merge(self) -> None:
        """Become the statistic of every rank's batches: each tensor of :meth:`state` summed over the
        ranks (in name order, the same on every rank)."""
        state = self.state()
        for name in sorted(state):
            distributed.all_reduce_sum(state[name])
        self.restore(state)

    def result(self):
        """What its owner reads."""
        raise NotImplementedError

