"""How well each transform stands in for its cut on held-out data: the mean cosine distance between
``L_{start-1}`` (transformed) and ``L_{end-1}`` before and after T, the Euclidean distance before,
the split into sink and ordinary tokens, and the linear CKA / mean CCA / PWCCA of the cut's two ends
(with the held-out token count: few for CCA in a large d, see
:data:`~replaceme_exp.row_format.MIN_TOKENS_PER_DIM`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from replaceme_exp.capture import TransformDistances, run_capture
from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.capture.hooks import input_device
from replaceme_exp.capture.similarity import (
    CCA_RIDGE,
    SimilarityStatistics,
    similarities_per_cut,
    similarity_columns,
    undersampled,
    undersampled_message,
)
from replaceme_exp.capture.statistics import split_columns
from replaceme_exp.data.batching import TokenBatches
from replaceme_exp.errors import check_finite
from replaceme_exp.evaluation.baseline import BaselineCache

log = logging.getLogger(__name__)


@dataclass
class HeldoutDistances:
    """``cos_dist_before`` / ``cos_dist_after`` (mean over the cuts' tokens), ``l2_dist_before`` and
    the columns of the sink/rest split and the CKA / CCA / PWCCA before (``*_before``:
    :func:`~replaceme_exp.capture.similarity.similarity_columns`)."""

    before: float
    after: float
    l2_before: float | None = None
    splits: dict = field(default_factory=dict)

    def columns(self) -> dict:
        check_finite("eval", "the held-out distances are", [self.before, self.after])
        out = {"cos_dist_before": self.before, "cos_dist_after": self.after, **self.splits}
        if self.l2_before is not None:
            out["l2_dist_before"] = self.l2_before
        return out


def heldout_pass(
    adapter,
    windows: TokenBatches,
    transforms: dict,
    placement: str,
    sink_threshold: float,
    execution: CaptureExecution | None = None,
) -> HeldoutDistances:
    """One pass over the held-out windows with every transform applied to its cut's input, run as
    the capture plan ``execution`` says (None: whole-model)."""
    check = TransformDistances(transforms, placement, sink_threshold)
    similarity = SimilarityStatistics(list(transforms), adapter.hidden_size, input_device(adapter, execution))
    run_capture(adapter, windows, [check, similarity], desc="held-out distances", execution=execution)
    columns = check.split_result()
    columns.update(similarity_columns(similarities_per_cut(similarity), "before", adapter.hidden_size))
    if undersampled(similarity.n_tokens, adapter.hidden_size):
        log.info("%s", undersampled_message(similarity.n_tokens, adapter.hidden_size, "held-out"))
    before, after = check.result()
    return HeldoutDistances(before, after, check.l2_result(), columns)


def heldout_distances(
    adapter,
    windows: TokenBatches,
    transforms: dict,
    baselines: BaselineCache,
    key: dict,
    placement: str = "fused",
    sink_threshold: float = 20.0,
    execution: CaptureExecution | None = None,
) -> HeldoutDistances:
    """:func:`heldout_pass` (run as the capture plan ``execution`` says), with what does not depend on
    T cached: the distances without T depend only on model, text, cuts and the sink threshold, so
    jobs without any transform need no pass."""
    key = {**key, "metric": "dist_before", "sink_threshold": float(sink_threshold), "sink_median": "sequence"}
    key["similarity"] = ["linear_cka", f"mean_cca/ridge={CCA_RIDGE}", f"pwcca/ridge={CCA_RIDGE}", "tokens"]
    if all(t is None for t in transforms.values()):

        def compute() -> list:
            found = heldout_pass(adapter, windows, transforms, "fused", sink_threshold, execution)
            return [found.before, found.l2_before, found.splits]

        before, l2, splits = baselines.get_or_compute(key, compute)
        return HeldoutDistances(before, before, l2, splits)
    found = heldout_pass(adapter, windows, transforms, placement, sink_threshold, execution)
    unchanged = {k: v for k, v in found.splits.items() if "_after_" not in k}
    after_is_before = {k.replace("_before_", "_after_"): v for k, v in unchanged.items() if "_before_" in k}
    baselines.put(key, [found.before, found.l2_before, {**unchanged, **after_is_before}])
    return found


def sequential_checks(checks: list[TransformDistances]) -> HeldoutDistances:
    """The held-out distances of transforms checked one after another (``multi_lt=sequential``),
    token-weighted over the stages, with the sink/rest split over all of them."""
    sums, total = [0.0, 0.0], 0
    for check in checks:
        n = sum(check.counts.values())
        before, after = check.result()
        sums, total = [sums[0] + before * n, sums[1] + after * n], total + n
    return HeldoutDistances(sums[0] / total, sums[1] / total, None, split_columns(checks))
