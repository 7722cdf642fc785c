"""estimation.tokens: which calibration tokens enter a transform's statistics and token store."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import CONF, ROOT, compose_config, config_hash, validate_config
from helpers.explicit import explicit_blocks
from helpers.models import tiny_model

from replaceme_exp.capture import LinearStatistics, TokenRule, TransformDistances, run_capture
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.statistics import BatchTokens, TokenCollector
from replaceme_exp.capture.token_rules import massive_tokens
from replaceme_exp.capture.token_store import TokenStore
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded

NUM_LAYERS = 6
CUTS = [(1, 3), (1, 4), (3, 5)]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", NUM_LAYERS)


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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.unit
def test_skip_massive_picks_exactly_the_tokens_above_the_threshold_on_a_hand_built_batch():
    hidden = 4
    base = torch.ones(8, hidden)  # norm 2 each: median norm 2
    before, after = base.clone(), base.clone()
    before[0] *= 25.0  # ratio 25 at the input: massive at 20
    after[5] *= 19.0  # ratio 19 at the target: not massive at 20
    after[6] *= 21.0  # ratio 21 at the target: massive
    tokens = BatchTokens(8, torch.tensor([7]), torch.arange(8))  # one sequence of 8 tokens
    keep = TokenRule("skip_massive", massive_threshold=20.0).keep(tokens, before, after)
    assert keep.tolist() == [False, True, True, True, True, True, False, True]
    assert massive_tokens((before, after), tokens.last_rows, 20.0).tolist() == [not k for k in keep.tolist()]
    lower = TokenRule("skip_massive", massive_threshold=10.0).keep(tokens, before, after)
    assert lower.tolist() == [False, True, True, True, True, False, False, True]
    scale = TokenRule("rescale_massive", massive_threshold=20.0).keep(tokens, before, after)
    torch.testing.assert_close(scale, torch.tensor([20 / 25, 1, 1, 1, 1, 1, 20 / 21, 1]))


@pytest.mark.unit
def test_massive_tokens_are_judged_against_their_own_sequence_so_batching_cannot_move_them():
    """Two sequences of very different scale: a token 5x its own sequence's median is massive at
    threshold 4, whether the sequences share a batch or not."""
    quiet = torch.ones(4, 2)
    loud = torch.ones(4, 2) * 100.0
    quiet[2] *= 5.0
    loud[1] *= 5.0
    together = massive_tokens((torch.cat([quiet, loud]),), torch.tensor([3, 7]), 4.0)
    apart = torch.cat([massive_tokens((x,), torch.tensor([3]), 4.0) for x in (quiet, loud)])
    assert together.tolist() == apart.tolist() == [False, False, True, False, False, True, False, False]


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.unit
def test_heldout_distances_are_split_into_sink_and_other_tokens():
    hidden, n = 4, 8
    g = torch.Generator().manual_seed(1)
    m = torch.randn(n, hidden, generator=g)
    prev = torch.randn(n, hidden, generator=g) + 2
    target = torch.randn(n, hidden, generator=g) + 2
    target[0] *= 50.0  # the sink
    check = TransformDistances({(1, 3): torch.eye(hidden) * 2}, sink_threshold=20.0)
    (keys, update), = check.requests()
    update({("M", 0): m, ("L", 0): prev, ("L", 2): target}, BatchTokens(n, torch.tensor([n - 1]), torch.arange(n)))
    received = prev - m + m @ (torch.eye(hidden) * 2)
    after = 1 - torch.nn.functional.cosine_similarity(received, target, dim=-1)
    before = 1 - torch.nn.functional.cosine_similarity(prev, target, dim=-1)
    split = check.split_result()
    assert split["heldout_sink_fraction"] == pytest.approx(1 / n)
    assert split["cos_dist_after_sink"] == pytest.approx(float(after[0]), rel=1e-5)
    assert split["cos_dist_after_rest"] == pytest.approx(float(after[1:].mean()), rel=1e-5)
    assert split["cos_dist_before_rest"] == pytest.approx(float(before[1:].mean()), rel=1e-5)
    assert check.result()[1] == pytest.approx(float(after.mean()), rel=1e-5)


@pytest.mark.unit
def test_the_rule_reaches_the_statistics_cache_key_and_the_config_hash(tmp_path):
    cache = StatisticsCache(tmp_path, "model", "data")
    stats = LinearStatistics([(1, 3)], 4, torch.device("cpu")).result()[(1, 3)]
    cache.put_stats(stats, "fused", TokenRule("skip_first").key())
    assert cache.get_stats((1, 3), "fused", TokenRule("skip_first").key()) is not None
    assert cache.get_stats((1, 3), "fused", TokenRule("skip_first", 2).key()) is None
    assert cache.get_stats((1, 3), "fused", TokenRule().key()) is None
    assert cache.get_stats((1, 3), "fused", TokenRule("skip_massive").key()) is None
    assert TokenRule("skip_massive", massive_threshold=10).key() != TokenRule("skip_massive").key()

    hashes = {
        rule: config_hash(compose_config([f"estimation={rule}"]))
        for rule in ("all", "skip_first", "skip_massive", "rescale_massive")
    }
    assert len(set(hashes.values())) == 4
    # first acts only with skip_first; nothing is fitted for plain removal
    assert config_hash(compose_config(["estimation=all", "estimation.first=3"])) == hashes["all"]
    assert config_hash(compose_config(["estimation=skip_first", "estimation.first=3"])) != hashes["skip_first"]
    removal = ["objective=identity", "selection=cosine"]
    assert config_hash(compose_config(removal + ["estimation=skip_first"])) == (
        config_hash(compose_config(removal + ["estimation=all"]))
    )
    assert config_hash(compose_config(["objective=identity", "selection=ls_residual", "estimation=skip_first"])) != (
        config_hash(compose_config(["objective=identity", "selection=ls_residual", "estimation=all"]))
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    "override, key",
    [
        ("estimation.tokens=sinks", "estimation.tokens"),
        ("estimation.first=0", "estimation.first"),
        ("estimation.massive_threshold=1", "estimation.massive_threshold"),
        ("estimation.massive_threshold=nan", "estimation.massive_threshold"),
    ],
)
def test_bad_token_rules_are_refused_before_any_work(override, key):
    with pytest.raises(ConfigError, match=key):
        validate_config(compose_config([override]))
    estimation = compose_config([override]).estimation
    with pytest.raises(ConfigError, match=key):
        TokenRule(estimation.tokens, estimation.first, estimation.massive_threshold)


TINY = [
    "model=tiny_llama",
    "calibration.n_samples=16",
    "calibration.seq_len=32",
    "eval.seq_len=32",
    "eval.max_windows=4",
    "tracking.wandb.mode=disabled",
    "tracking.codecarbon.enabled=false",
    "eval=heldout",  # held-out perplexity only (eval=quick would add lm-eval's offline tasks)
    "save_model=false",
    "cuts=[[2,4]]",
]


@pytest.mark.integration
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


@pytest.mark.integration
def test_numerical_objectives_fit_on_the_kept_tokens_only(tmp_path):
    overrides = TINY + [f"results_dir={tmp_path}", "objective=cosine", "objective.epochs=1", "estimation=skip_first"]
    row = run_recorded(compose_config(overrides + ["estimation.first=4"]))
    n_sequences = 16
    assert row["status"] == "finished" and row["solver"] == "adam"
    assert row["estimation_tokens"] == "skip_first" and row["estimation_first"] == 4
    assert 0 < row["fit_tokens"]["2-4"] <= row["n_calib_tokens"] - n_sequences


@pytest.mark.unit
def test_a_rule_that_leaves_no_token_fails_with_one_line_before_any_work(tmp_path):
    overrides = TINY + [f"results_dir={tmp_path}", "estimation=skip_first", "estimation.first=32"]
    row = run_recorded(compose_config(overrides), raise_on_failure=False)
    assert row["status"] == "failed" and row["config_hash"].startswith("invalid-")  # refused before loading
    assert row["error"] == "ConfigError: estimation.first=32: leaves no token of sequences of calibration.seq_len=32"


@pytest.mark.unit
def test_paper_table_cells_show_the_all_tokens_runs_and_name_the_others():
    """Rows without the column count as the paper's ``all``; a cell matching runs of several
    rules shows ``all`` even when another rule has more runs."""
    from helpers.tables import SPECS, cells, frame, run

    from replaceme_exp.reporting.paper_tables import build_table, table_notes

    runs = frame(
        run(1, avg_acc=0.60, setting_hash="paper"),  # written before estimation_tokens existed
        run(2, avg_acc=0.70, estimation_tokens="rescale_massive", massive_threshold=20.0, setting_hash="r"),
        run(3, avg_acc=0.72, estimation_tokens="rescale_massive", massive_threshold=20.0, setting_hash="r"),
    )
    table = build_table(SPECS["llama3_main"], runs)
    assert cells(table, "ReplaceMe", "Linear (Cosine)")["Avg-acc"] == "0.6"
    assert "estimation_tokens=rescale_massive" in table_notes(table)[0]


@pytest.mark.unit
@pytest.mark.slow
def test_paper_presets_and_templates_fit_on_every_token():
    """The paper's setting stays ``all`` in its presets and templates, whatever the default is."""
    from helpers.templates import TEMPLATES, template_override

    # what a user adds to a template: the CLIP template calibrates on their own image folder
    user_overrides = {"paper/clip": [f"calibration.path={ROOT}"]}
    experiments = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    assert "replaceme_official" in experiments
    # the project's own presets beyond the paper, on its default sink-aware estimation on purpose
    own = {"replaceme_ls_sink_aware", "ls_ridge_identity", "replaceme_ls_shortgpt_cuts", "replaceme_recipe"}
    for name in own:
        assert compose_config([f"experiment={name}"]).estimation.tokens == "rescale_massive", name
    experiments = [e for e in experiments if e not in own]
    for overrides in [[f"experiment={e}"] for e in experiments] + [
        [template_override(t), *user_overrides.get(t, [])] for t in TEMPLATES if t.startswith("paper/")
    ]:
        cfg = compose_config(overrides)
        assert cfg.estimation.tokens == "all", overrides
        assert JobSpec.from_config(cfg).identity()["estimation"]["tokens"] == "all", overrides
