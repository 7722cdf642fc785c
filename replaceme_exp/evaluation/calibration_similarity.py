"""The similarity of each cut's two ends over the calibration tokens (``record_calibration_similarity=true``):
linear CKA, mean CCA and PWCCA of ``L_{start-1}`` and ``L_{end-1}`` in the unpruned model, from one
pass over the calibration batches, cached per cut (by model, calibration tokens, ridge and the
products' precision).

Held-out windows are too few tokens for mean CCA / PWCCA in a large d (the paper template's 8,192
held-out tokens are 2 x d on Llama 3 8B, where two independent representations score 0.64); the
calibration set (SlimOrca: 8,000 samples of up to 1,024 tokens) gives hundreds of tokens per dimension.
"""

from __future__ import annotations

import logging

from replaceme_exp.capture import SimilarityStatistics, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.execution import CaptureExecution
from replaceme_exp.capture.hooks import input_device
from replaceme_exp.capture.similarity import (
    CCA_RIDGE,
    Similarities,
    StoredSimilarities,
    similarities_per_cut,
    similarity_columns,
    undersampled,
    undersampled_message,
)
from replaceme_exp.capture.statistics import Cut
from replaceme_exp.data.batching import TokenBatches

log = logging.getLogger(__name__)


def similarity_criterion(precision: str) -> str:
    """What a cached similarity depends on besides model, data and cut."""
    return f"ridge={CCA_RIDGE}" + ("" if precision == "float64" else f"/{precision}")


def calibration_similarities(
    adapter,
    batches: TokenBatches,
    cache: StatisticsCache,
    cuts: list[Cut],
    precision: str = "float64",
    execution: CaptureExecution | None = None,
) -> dict[Cut, Similarities]:
    """Linear CKA, mean CCA and PWCCA of every cut over all non-padding tokens of ``batches``:
    from the cache, else from one pass for the cuts it lacks (products in ``precision``), run as the
    capture plan ``execution`` says (None: whole-model)."""
    criterion = similarity_criterion(precision)
    found = {cut: cache.read(StoredSimilarities(cut, criterion)) for cut in cuts}
    missing = [cut for cut, value in found.items() if value is None]
    if missing:
        statistics = SimilarityStatistics(missing, adapter.hidden_size, input_device(adapter, execution), precision)
        run_capture(adapter, batches, [statistics], desc="calibration similarity", execution=execution)
        for cut, value in similarities_per_cut(statistics).items():
            cache.store(StoredSimilarities(cut, criterion, value))
            found[cut] = value
    return found


def calibration_similarity_columns(
    adapter,
    batches: TokenBatches,
    cache: StatisticsCache,
    cuts: list[Cut],
    precision: str = "float64",
    execution: CaptureExecution | None = None,
) -> dict:
    """The row's ``*_calibration`` similarity columns of ``cuts`` (means over the cuts; see
    :func:`~replaceme_exp.capture.similarity.similarity_columns`; the pass run as the capture plan
    ``execution`` says); a warning when the tokens are few."""
    found = calibration_similarities(adapter, batches, cache, cuts, precision, execution)
    columns = similarity_columns(found, "calibration", adapter.hidden_size)
    n_tokens = columns["similarity_tokens_calibration"]
    if undersampled(n_tokens, adapter.hidden_size):
        log.warning("%s", undersampled_message(n_tokens, adapter.hidden_size, "calibration"))
    return columns
