"""make paper-tables on a store built by a small real sweep plus synthetic paper-scale rows:
the expected cells, missing cells, baseline rows, quoted rows kept apart, and the figures; and
rendered from runs of another model, calibration set and suite (MODEL=, CALIBRATION=, EVAL=)."""

from __future__ import annotations

import pytest
from helpers.config import compose_config, typed
from helpers.paper_tables import LLAMA2_TABLE_COLUMNS
from helpers.tables import SPECS, cells, frame, run

from replaceme_exp.reporting.paper_figures import _undersampled_footnote, block_selection, calibration_size
from replaceme_exp.reporting.paper_settings import (
    LLAMA3_25,
    Retargeting,
    Target,
    Unresolved,
    resolve_target,
    translate_n_prune,
)
from replaceme_exp.reporting.paper_tables import TABLES, build_table, load_quoted


def test_quoted_numbers_cover_columns_of_their_tables():
    quoted = load_quoted()
    for spec in TABLES:
        if spec.name in quoted:
            assert spec.quoted_at is not None
            headers = {c.header for c in spec.column_specs()}
            for row in quoted[spec.name]["rows"]:
                assert set(row["values"]) <= headers, (spec.name, row["label"])


def test_the_hub_clip_model_offline_fails_with_a_clear_error(tmp_path):
    cfg = typed(["model=clip_vit_l14", "eval=clip", "calibration=bundled_images"])
    from replaceme_exp.errors import ConfigError
    from replaceme_exp.models import load_model

    with pytest.raises(ConfigError, match=r"model.pretrained='openai/clip-vit-large-patch14': cannot be loaded"):
        load_model(cfg.model)


def test_table_columns_name_what_the_suites_record():
    """The Llama 2 table and the per-task columns read exactly the metric columns
    (``<metric>_<task>``) of the metrics that eval=llama2_table and eval=paper declare."""

    def declared(suite: str) -> list[str]:
        metrics = compose_config([f"eval={suite}"]).eval.harness.metrics
        return [f"{m}_{t}" for t, m in metrics.items() if m not in ("perplexity", "word_perplexity")]

    assert [m for _, m in LLAMA2_TABLE_COLUMNS] == declared("llama2_table")
    healing = next(t for t in TABLES if t.name == "healing")
    task_columns = [c.metric for c in healing.column_specs() if c.metric.startswith("acc")]
    assert task_columns == declared("paper")


def tiny(i: int, **values) -> dict:
    """A finished tiny_llama LS run of the smoke sweep (pydoc, eval=heldout)."""
    base = dict(model="tiny_llama", num_layers=6, n_prune=2, calibration="pydoc", n_calib_samples=128)
    base.update(
        eval="heldout", objective="ls", solver=None, solver_schedule=None, dtype="float32", ppl_heldout=50.0 + i
    )
    return run(i, **{**base, **values})


TINY = dict(model="tiny_llama", calibration="pydoc", eval="heldout")


def test_n_prune_keeps_its_fraction_of_the_depth():
    assert translate_n_prune(8, 32, 6) == 2 and translate_n_prune(8, 32, 30) == 8
    assert translate_n_prune(4, 32, 6) == 1 and translate_n_prune(30, 80, 6) == 2
    assert translate_n_prune(6, 24, 6) == 2 and translate_n_prune(12, 32, 6) == 2
    for depth, expected in ((6, 2), (30, 8)):
        target = resolve_target(frame(tiny(1, num_layers=depth)), model="tiny_llama")
        assert target.depth == depth and Retargeting(target).conditions(LLAMA3_25)["n_prune"] == expected
    # Runs that disagree on the depth (or record none): n_prune is left unmatched, not guessed.
    target = resolve_target(frame(tiny(1), tiny(2, num_layers=8)), model="tiny_llama")
    assert target.depth is None and "num_layers in {6, 8}" in target.depth_problem
    assert isinstance(Retargeting(target).conditions(LLAMA3_25)["n_prune"], Unresolved)
    table = build_table(SPECS["structured_lts"], frame(tiny(1), tiny(2, num_layers=8)), target=target)
    assert cells(table, "Generic")["Runs"] == 0 and "n_prune left unmatched" in table.attrs["retargeted"]


def test_calibration_is_retargeted_where_the_paper_uses_its_default_data_only():
    runs = frame(
        tiny(1),
        tiny(2, calibration="fineweb", n_calib_samples=8000),
        tiny(3, n_calib_samples=8),  # not pydoc's default size (128): not the paper's 8k
        tiny(4, n_calib_samples=1000, objective="cosine", solver="adam", solver_schedule="minibatch"),
    )
    target = resolve_target(runs, model="tiny_llama", calibration="pydoc", eval="heldout")
    assert target.calib_samples == 128
    table = build_table(SPECS["calibration_types"], runs, target=target)
    assert cells(table, "LS, slimorca")["Perplexity (ppl_heldout, held-out text)"] == "51"  # the pydoc run, 128
    assert cells(table, "LS, fineweb")["Perplexity (ppl_heldout, held-out text)"] == "52"  # kept its data
    assert "calibration=pydoc (paper: slimorca)" in table.attrs["retargeted"]
    masking = build_table(SPECS["masking"], runs, target=target)
    assert cells(masking, "1k samples, no masking")["Runs"] == 1  # other sizes stay
    assert cells(masking, "8k samples, no masking")["Runs"] == 0


def test_calibration_and_eval_are_inferred_from_the_models_runs():
    runs = frame(
        tiny(1, calibration="fineweb", eval="offline"),
        tiny(2),
        tiny(3),
        run(4, model="other"),  # another model's runs do not count
        run(5, model="other"),
        run(6, model="other"),
    )
    target = resolve_target(runs, model="tiny_llama")
    assert (target.calibration, target.eval) == ("pydoc", "heldout")
    assert target.inferred["calibration"] == "inferred from 3 finished tiny_llama runs: pydoc 2, fineweb 1"
    # A tie: the latest run's. Given values are kept, and the suite's own perplexity is read.
    tie = resolve_target(frame(tiny(1), tiny(2, calibration="fineweb", eval="offline")), model="tiny_llama")
    assert (tie.calibration, tie.eval, tie.ppl[0]) == ("fineweb", "offline", "ppl_pydoc")
    given = resolve_target(runs, model="tiny_llama", eval="offline")
    assert given.eval == "offline" and "eval" not in given.inferred and given.calibration == "fineweb"
    assert resolve_target(runs).retargeted is False and resolve_target(runs, model="nothing").calibration is None


def test_a_perplexity_column_reads_the_suites_perplexity_and_baseline():
    runs = frame(tiny(1, ppl_heldout_baseline=40.0), tiny(2, eval="offline", ppl_pydoc=9.0, baseline_ppl_pydoc=7.0))
    quick = build_table(SPECS["llama3_main"], runs, load_quoted(), resolve_target(runs, **TINY))
    assert cells(quick, "Llama 3 8B Instruct")["Perplexity (ppl_heldout, held-out text)"] == "40"
    assert cells(quick, "ReplaceMe", "Linear (LS)")["Perplexity (ppl_heldout, held-out text)"] == "51"
    assert "(quoted)" not in " ".join(quick["Setting"]) and "quoted rows" in quick.attrs["retargeted"]
    table = build_table(SPECS["llama3_main"], runs, target=resolve_target(runs, **{**TINY, "eval": "offline"}))
    column = "Perplexity (ppl_pydoc, replaceme_pydoc_ppl, eval=offline)"
    assert cells(table, "Llama 3 8B Instruct")[column] == "7"
    assert cells(table, "ReplaceMe", "Linear (LS)")[column] == "9"


def test_counts_and_the_hint_when_no_run_matched():
    runs = frame(tiny(1, n_prune=1), tiny(2, n_prune=3), run(3))
    table = build_table(SPECS["structured_lts"], runs, target=resolve_target(runs, **TINY))
    assert table.attrs["counts"] == (
        "structured_lts: 2 runs found (model=tiny_llama, calibration=pydoc, eval=heldout), 0 matched a cell, 0 shown; "
        "0 matched: n_prune=2 wanted, runs have n_prune in {1, 3}"
    )
    # Without a target: the paper's settings; the Llama 3 run (cosine) is found, not matched (LS).
    paper = build_table(SPECS["structured_lts"], runs).attrs["counts"]
    assert paper == (
        "structured_lts: 1 run found (model=llama3_8b_instruct, calibration=slimorca, eval=paper), 0 matched a cell, "
        "0 shown; 0 matched: objective=ls wanted, runs have objective in {cosine}"
    )


def test_a_retargeted_cell_still_shows_one_setting_and_names_the_others(tmp_path):
    runs = frame(
        tiny(1, setting_hash="f32"),
        tiny(2, setting_hash="f32", seed=7, ppl_heldout=53.0),
        tiny(3, dtype="bfloat16", setting_hash="bf16", ppl_heldout=99.0),
    )
    target = resolve_target(runs, model="tiny_llama")
    table = build_table(SPECS["structured_lts"], runs, target=target)
    generic = cells(table, "Generic")
    assert generic["Runs"] == 1 and generic["Perplexity (ppl_heldout, held-out text)"] == "99"  # bfloat16 preferred
    assert table.attrs["notes"] == ["Generic: not shown, 1 other setting matched: dtype=float32 (n=2)"]
    assert table.attrs["counts"].endswith("3 matched a cell, 1 shown")
    plotted = calibration_size(runs, tmp_path / "size.png", target=target)
    point = plotted[(plotted.panel == "ppl_heldout") & (plotted.series == "LS")].iloc[0]
    assert point["n"] == 1 and "dtype=float32 (n=2)" in point["note"]


@pytest.mark.slow
def test_no_target_renders_the_papers_settings_unchanged():
    runs = frame(run(1, avg_acc=0.6, ppl_lambada=20.0), tiny(2))
    for spec in TABLES:
        plain, paper = build_table(spec, runs), build_table(spec, runs, target=Target())
        assert plain.equals(paper) and paper.attrs["retargeted"] is None
    # the paper's protocol: rows without a protocol column are the paper's (cells.DEFAULTS_FOR_MISSING_COLUMNS)
    assert Retargeting(Target()).conditions(LLAMA3_25) == {**LLAMA3_25, "protocol": "paper"}


@pytest.mark.slow
def test_block_selection_takes_cka_cca_pwcca_from_the_calibration_tokens_where_recorded(tmp_path):
    held_out = dict(linear_cka_before=0.7, mean_cca_before=0.9, pwcca_before=0.95, similarity_undersampled_before=True)
    windows = [
        run(1, objective="ls", cuts="[[1, 9]]", selection_metric=None, cos_dist_before=0.5, avg_acc=0.4, **held_out),
        run(2, objective="ls", cuts="[[20, 28]]", selection_metric=None, cos_dist_before=0.2, avg_acc=0.6, **held_out),
    ]
    plotted = block_selection(frame(*windows), tmp_path / "held_out.png")
    assert {"linear_cka_before", "mean_cca_before", "pwcca_before"} <= set(plotted.panel)
    footnote = _undersampled_footnote([frame(*windows)], "before")
    assert footnote.startswith("2 run(s)' mean CCA / PWCCA (held-out) come from fewer than 50 x d tokens")
    calibration = [
        dict(linear_cka_calibration=0.6, mean_cca_calibration=0.3, pwcca_calibration=0.5),
        dict(linear_cka_calibration=0.8, mean_cca_calibration=0.4, pwcca_calibration=0.7),
    ]
    for row, values in zip(windows, calibration):
        row.update(values, similarity_undersampled_calibration=False, similarity_tokens_calibration=10**6)
    plotted = block_selection(frame(*windows), tmp_path / "calibration.png")
    assert _undersampled_footnote([frame(*windows)], "calibration") is None
    held_out_panels = {panel for panel in plotted.panel if panel.endswith("_before")}
    assert held_out_panels == {"cos_dist_before", "profile_cos_dist_before"}  # cosine is held-out only
    pw = plotted[plotted.panel == "pwcca_calibration"].sort_values("x")
    assert pw["x"].tolist() == [0.5, 0.7] and pw["mean"].tolist() == [0.4, 0.6]
    profile = plotted[plotted.panel == "profile_mean_cca_calibration"].sort_values("x")
    assert profile["x"].tolist() == [1.0, 20.0] and profile["mean"].tolist() == pytest.approx([0.7, 0.6])


def test_a_table_reads_only_runs_of_its_modality_whatever_model_it_is_retargeted_to():
    """``make paper-tables MODEL=smollm2_135m`` once put two text-model runs into the CLIP table."""
    uidl = dict(objective="identity", selection_metric="angular_last", n_prune=1)
    text_runs = [tiny(1, modality="text", **uidl), tiny(2, modality="text", n_prune=1)]
    old_vision_row = tiny(3, n_prune=1, eval_benchmarks='["bundled_objects"]', acc1_cifar10=0.5)  # no modality column
    runs = frame(*text_runs, old_vision_row)
    target = resolve_target(runs, model="tiny_llama", eval="heldout")
    clip = build_table(SPECS["clip"], runs, target=target)
    measured = clip[clip["Runs"].map(lambda v: isinstance(v, int))]
    assert measured["Runs"].sum() == 1  # the vision row (inferred from eval_benchmarks), not the text runs
    assert "1 run found" in clip.attrs["counts"]
    vision_ls = {**old_vision_row, "objective": "ls"}
    structured = build_table(SPECS["structured_lts"], frame(*text_runs, vision_ls), target=target)
    assert "2 runs found" in structured.attrs["counts"]  # the two text runs; never the vision row
