"""estimation.tokens: which calibration tokens enter a transform's statistics and token store."""

from __future__ import annotations

import pytest
import torch
from helpers.config import CONF, ROOT, compose_config, config_hash, validate_config
from helpers.token_rules import TINY

from replaceme_exp.capture import LinearStatistics, TokenRule, TransformDistances
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.statistics import BatchTokens, StoredLinearStats
from replaceme_exp.capture.token_rules import massive_tokens
from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded


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


@pytest.mark.slow
def test_the_rule_reaches_the_statistics_cache_key_and_the_config_hash(tmp_path):
    cache = StatisticsCache(tmp_path, "model", "data")
    stats = LinearStatistics([(1, 3)], 4, torch.device("cpu")).result()[(1, 3)]
    cache.store(StoredLinearStats.of(stats, "fused", TokenRule("skip_first").key()))
    assert cache.read(StoredLinearStats((1, 3), "fused", TokenRule("skip_first").key())) is not None
    assert cache.read(StoredLinearStats((1, 3), "fused", TokenRule("skip_first", 2).key())) is None
    assert cache.read(StoredLinearStats((1, 3), "fused", TokenRule().key())) is None
    assert cache.read(StoredLinearStats((1, 3), "fused", TokenRule("skip_massive").key())) is None
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


def test_a_rule_that_leaves_no_token_fails_with_one_line_before_any_work(tmp_path):
    overrides = TINY + [f"results_dir={tmp_path}", "estimation=skip_first", "estimation.first=32"]
    row = run_recorded(compose_config(overrides), raise_on_failure=False)
    assert row["status"] == "failed" and row["config_hash"].startswith("invalid-")  # refused before loading
    assert row["error"] == "ConfigError: estimation.first=32: leaves no token of sequences of calibration.seq_len=32"


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
