"""estimation.tokens: which calibration tokens enter a transform's statistics and token store."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import compose_config
from helpers.explicit import explicit_blocks
from helpers.token_rules import TINY, model

from replaceme_exp.capture import LinearStatistics, TokenRule, run_capture
from replaceme_exp.capture.statistics import BatchTokens, TokenCollector
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.models import adapter_for
from replaceme_exp.runtime import run_recorded


CUTS = [(1, 3), (1, 4), (3, 5)]


def explicit_stats(model, sequences, cuts, select):
    """M^T M, M^T R, ||R||^2 and token counts per cut from the hand-written forward pass, over
    the rows ``select(positions, blocks, cut)`` returns for each sequence (bool mask or float
    scale of each row)."""
    out = {c: [0, 0, 0.0, 0] for c in cuts}
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        positions = torch.arange(len(seq))
        for cut in cuts:
            start, end = cut
            m = blocks[start - 1]["M"].double()
            r = (blocks[end - 1]["L"] - blocks[start - 1]["Y"]).double()
            chosen = select(positions, blocks, cut)
            if chosen.dtype == torch.bool:
                m, r = m[chosen], r[chosen]
            else:
                m, r = m * chosen.double()[:, None], r * chosen.double()[:, None]
            entry = out[cut]
            entry[0] = entry[0] + m.T @ m
            entry[1] = entry[1] + m.T @ r
            entry[2] += float(r.pow(2).sum())
            entry[3] += m.shape[0]
    return out


def assert_stats_equal(captured, expected):
    for cut, (mtm, mtr, r_sq, n) in expected.items():
        got = captured[cut]
        assert got.n_tokens == n
        torch.testing.assert_close(got.mtm, mtm, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.mtr, mtr, rtol=1e-4, atol=1e-5)
        assert got.r_sq == pytest.approx(r_sq, rel=1e-5)


@pytest.mark.parametrize("first", [1, 3])
@pytest.mark.parametrize("side", ["right", "left"])
def test_skip_first_statistics_equal_those_of_explicitly_sliced_activations(model, first, side):
    sequences = random_sequences(7, 2, 14, seed=5)
    accumulator = LinearStatistics(CUTS, 32, torch.device("cpu"), rule=TokenRule("skip_first", first))
    run_capture(adapter_for(model), batches_of(sequences, 3, side), [accumulator])
    expected = explicit_stats(model, sequences, CUTS, lambda positions, blocks, cut: positions >= first)
    assert_stats_equal(accumulator.result(), expected)
    everything = explicit_stats(model, sequences, CUTS, lambda positions, blocks, cut: positions >= 0)
    assert accumulator.result()[CUTS[0]].n_tokens < everything[CUTS[0]][3]


def test_skip_first_counts_positions_of_masked_copies_not_visible_tokens(model):
    """A masked copy hides tokens but keeps positions: position 0 stays the one left out."""
    from replaceme_exp.data.augmentation import masked_copy

    batch = batches_of(random_sequences(4, 8, 12, seed=2), 4)
    masked = masked_copy(batch.batches[0], 0.5, torch.Generator().manual_seed(0))
    seen = []

    class Positions:
        takes_padding = False

        def requests(self):
            return [((("L", 0),), lambda acts, tokens: seen.append(tokens.positions.clone()))]

    run_capture(adapter_for(model), type(batch)([masked], batch.seq_len), [Positions()])
    visible = masked.attention_mask.bool()
    torch.testing.assert_close(seen[0], masked.position_ids[visible])
    assert int((seen[0] == 0).sum()) == 4 and seen[0].numel() < seen[0].max() * 4


def test_skip_massive_gives_each_cut_its_own_tokens(model):
    """The kept tokens depend on the cut's target, so cuts that share a start get their own M^T M
    (a hand-built batch with one massive token at one cut's target only)."""
    hidden, n = 4, 6
    g = torch.Generator().manual_seed(0)
    acts = {key: torch.randn(n, hidden, generator=g) + 3 for key in (("M", 0), ("L", 0), ("L", 2), ("L", 3))}
    acts[("L", 3)][2] *= 100.0  # massive at the target of (1, 4) only
    accumulator = LinearStatistics([(1, 3), (1, 4)], hidden, torch.device("cpu"), rule=TokenRule("skip_massive"))
    tokens = BatchTokens(n, torch.tensor([n - 1]), torch.arange(n))
    for _, update in accumulator.requests():
        update(acts, tokens)
    stats = accumulator.result()
    m = acts[("M", 0)].double()
    keep = torch.ones(n, dtype=torch.bool)
    keep[2] = False
    assert stats[(1, 3)].n_tokens == n and stats[(1, 4)].n_tokens == n - 1
    torch.testing.assert_close(stats[(1, 3)].mtm, m.T @ m)
    torch.testing.assert_close(stats[(1, 4)].mtm, m[keep].T @ m[keep])
    r = (acts[("L", 3)] - acts[("L", 0)] + acts[("M", 0)]).double()[keep]
    torch.testing.assert_close(stats[(1, 4)].mtr, m[keep].T @ r)


def test_rescale_massive_statistics_equal_an_explicitly_weighted_sum(model):
    sequences = random_sequences(6, 4, 12, seed=9)
    threshold = 1.05  # random weights have no sinks: a low threshold makes some tokens "massive"
    rule = TokenRule("rescale_massive", massive_threshold=threshold)
    accumulator = LinearStatistics(CUTS, 32, torch.device("cpu"), rule=rule)
    run_capture(adapter_for(model), batches_of(sequences, 4), [accumulator])

    # Medians are per sequence: the reference sees one sequence at a time.
    blocks = [explicit_blocks(model, torch.tensor(s)) for s in sequences]

    def scale(positions, seq_blocks, cut):
        ratio = torch.maximum(
            *(seq_blocks[k - 1]["L"].norm(dim=-1) / seq_blocks[k - 1]["L"].norm(dim=-1).median() for k in cut)
        )
        return torch.where(ratio > threshold, threshold / ratio, torch.ones_like(ratio))

    expected = explicit_stats(model, sequences, CUTS, scale)
    weights = [scale(None, b, CUTS[0]) for b in blocks]
    assert any(bool((w < 1).any()) for w in weights) and any(bool((w == 1).any()) for w in weights)
    assert_stats_equal(accumulator.result(), expected)


def test_token_collector_stores_only_the_kept_tokens(model):
    sequences = random_sequences(5, 3, 10, seed=4)
    n_tokens = sum(len(s) for s in sequences)
    store = TokenStore(("M", "R"), n_tokens, 32, torch.device("cpu"), location="cpu", dtype=torch.float32)
    collector = TokenCollector((2, 4), store, rule=TokenRule("skip_first", 2))
    run_capture(adapter_for(model), batches_of(sequences, 2), [collector])
    store.truncate(collector.offset)
    rows_m, rows_r = [], []
    for seq in sequences:
        blocks = explicit_blocks(model, torch.tensor(seq))
        rows_m.append(blocks[1]["M"][2:])
        rows_r.append((blocks[3]["L"] - blocks[1]["Y"])[2:])
    assert collector.offset == store.n_tokens == sum(max(len(s) - 2, 0) for s in sequences) < n_tokens
    torch.testing.assert_close(store.tensors["M"], torch.cat(rows_m), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(store.tensors["R"], torch.cat(rows_r), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        store.truncate(n_tokens + 1)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["skip_first", "skip_massive", "rescale_massive"])
def test_jobs_record_the_rule_the_tokens_fitted_and_the_split(tmp_path, rule):
    overrides = TINY + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", f"estimation={rule}"]
    base = run_recorded(
        compose_config(TINY + [f"results_dir={tmp_path}", f"capture.cache_dir={tmp_path}/stats", "estimation=all"])
    )
    row = run_recorded(compose_config(overrides + ["estimation.massive_threshold=1.5"]))
    assert base["estimation_tokens"] == "all" and row["estimation_tokens"] == rule
    assert base["fit_tokens"]["2-4"] == base["n_calib_tokens"]
    assert row["massive_threshold"] == 1.5 and "statistics" not in row["cached_stages"]  # not those of "all"
    if rule == "rescale_massive":
        assert row["fit_tokens"]["2-4"] == row["n_calib_tokens"]
    else:
        assert 0 < row["fit_tokens"]["2-4"] < row["n_calib_tokens"]
    assert row["estimation_first"] == (1 if rule == "skip_first" else None)
    for column in ("cos_dist_after_sink", "cos_dist_after_rest", "cos_dist_before_rest", "heldout_sink_fraction"):
        assert column in row
    assert row["cos_dist_after"] != base["cos_dist_after"]


@pytest.mark.slow
def test_numerical_objectives_fit_on_the_kept_tokens_only(tmp_path):
    overrides = TINY + [f"results_dir={tmp_path}", "objective=cosine", "objective.epochs=1", "estimation=skip_first"]
    row = run_recorded(compose_config(overrides + ["estimation.first=4"]))
    n_sequences = 16
    assert row["status"] == "finished" and row["solver"] == "adam"
    assert row["estimation_tokens"] == "skip_first" and row["estimation_first"] == 4
    assert 0 < row["fit_tokens"]["2-4"] <= row["n_calib_tokens"] - n_sequences
