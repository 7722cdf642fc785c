"""What a paper-table cell (and a figure point) averages: runs identical except for the seed; the
paper's metric per task; the latest finished run per config; time/emissions from uncached runs.
Synthetic runs only (no jobs)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from helpers.config import ROOT
from helpers.tables import SPECS, cells, frame, run

from replaceme_exp.reporting.cells import choose_setting
from replaceme_exp.reporting.paper_figures import calibration_size, leaderboard, time_emissions
from replaceme_exp.reporting.paper_tables import MISSING, TASK_COLUMNS, build_table, table_notes, to_latex, to_markdown
from replaceme_exp.results import ResultsStore


PERPLEXITY = ("perplexity", "word_perplexity")  # metrics recorded as ppl_<name>, not in avg_acc

MIXED = [
    run(1, avg_acc=0.60, rp=0.85, ppl_lambada=20.0, setting_hash="adam"),
    run(2, avg_acc=0.62, rp=0.87, ppl_lambada=22.0, setting_hash="adam"),
    run(3, avg_acc=0.50, rp=0.70, solver="lbfgs", solver_schedule="full_batch", setting_hash="lbfgs"),
    run(4, avg_acc=0.52, rp=0.72, solver="trust_ncg", solver_schedule="full_batch", setting_hash="tncg"),
    run(5, avg_acc=0.70, rp=0.99, dtype="float32", setting_hash="fp32"),
]


@pytest.mark.parametrize("with_setting_hash", [True, False])
def test_a_cell_shows_the_declared_setting_and_names_the_others(with_setting_hash):
    runs = frame(*MIXED)
    if not with_setting_hash:  # rows written before setting_hash: a signature over the setting columns
        runs = runs.drop(columns="setting_hash")
    spec = SPECS["llama3_main"]
    table = build_table(spec, runs)
    cosine = cells(table, "ReplaceMe", "Linear (Cosine)")
    assert cosine["Runs"] == 2
    assert cosine["Avg-acc"] == "0.61 ± 0.014 (n=2)" and cosine["RP"] == "0.86 ± 0.014 (n=2)"
    assert cosine["Lambada OpenAI ppl"] == "21 ± 1.4 (n=2)"
    note = (
        "ReplaceMe, Linear (Cosine): not shown, 3 other settings matched: "
        "dtype=float32 (n=1); solver=trust_ncg, solver_schedule=full_batch (n=1); "
        "solver=lbfgs, solver_schedule=full_batch (n=1)"
    )  # the others best first: most preferences met, then most runs, then latest
    assert table_notes(table) == [note]
    markdown = to_markdown(spec, table)
    assert f"- {note}." in markdown and "most preferred settings (dtype=bfloat16, solver=adam" in markdown
    latex = to_latex(spec, table)
    assert r"solver=trust\_ncg, solver\_schedule=full\_batch (n=1)" in latex
    # The LS row matches none of these runs: no note, no runs.
    assert cells(table, "ReplaceMe", "Linear (LS)")["Runs"] == 0


def test_the_solvers_table_still_shows_each_solver_in_its_own_row():
    table = build_table(SPECS["solvers"], frame(*MIXED))
    assert cells(table, "Cosine, lbfgs")["Avg-acc"] == "0.5" and cells(table, "Cosine, lbfgs")["Runs"] == 1
    assert cells(table, "Cosine, adam")["Avg-acc"] == "0.61 ± 0.014 (n=2)"
    assert table_notes(table) == ["Cosine, adam: not shown, 1 other setting matched: dtype=float32 (n=1)"]


@pytest.mark.parametrize("with_setting_hash", [True, False])
def test_runs_that_differ_only_in_the_seed_are_averaged(with_setting_hash):
    runs = frame(
        run(1, avg_acc=0.60, setting_hash="s", n_calib_tokens=100, git_sha="a"),
        run(2, avg_acc=0.62, setting_hash="s", n_calib_tokens=101, git_sha="b"),
        run(3, avg_acc=0.64, setting_hash="s", n_calib_tokens=102, git_sha="c"),
    )
    if not with_setting_hash:
        runs = runs.drop(columns="setting_hash")
    table = build_table(SPECS["llama3_main"], runs)
    cosine = cells(table, "ReplaceMe", "Linear (Cosine)")
    assert cosine["Runs"] == 3 and cosine["Avg-acc"] == "0.62 ± 0.02 (n=3)"
    assert table_notes(table) == []
    assert "not shown" not in to_markdown(SPECS["llama3_main"], table)


def test_the_choice_is_deterministic_most_preferences_then_most_runs_then_latest():
    # No preference tells these eval batch sizes apart: most runs wins.
    runs = frame(
        run(1, avg_acc=0.6, eval_batch_size=8, setting_hash="b8"),
        run(2, avg_acc=0.6, eval_batch_size=8, setting_hash="b8"),
        run(3, avg_acc=0.5, eval_batch_size=16, setting_hash="b16"),
    )
    for order in (runs, runs.iloc[::-1]):
        choice = choose_setting(order)
        assert choice.groups[0].key.split(":")[1] == "b8" and [g.n for g in choice.groups] == [2, 1]
    assert choice.note("x") == "x: not shown, 1 other setting matched: eval_batch_size=16 (n=1)"
    # Equal runs: the latest wins; a preference beats both.
    tie = frame(run(1, eval_batch_size=8, setting_hash="b8"), run(2, eval_batch_size=16, setting_hash="b16"))
    assert choose_setting(tie).groups[0].key.split(":")[1] == "b16"
    assert choose_setting(tie, {"eval_batch_size": 8}).groups[0].key.split(":")[1] == "b8"
    # The row's declared preference (a float32 run over more bfloat16 runs).
    spec = SPECS["llama3_main"]
    rows = [
        replace(r, prefer={"dtype": "float32"}) if r.text.get("Linear transform") == "Linear (Cosine)" else r
        for r in spec.row_specs()
    ]
    table = build_table(replace(spec, rows=rows), frame(*MIXED))
    assert cells(table, "ReplaceMe", "Linear (Cosine)")["Avg-acc"] == "0.7"
    assert table_notes(table)[0].startswith("ReplaceMe, Linear (Cosine): not shown, 3 other settings matched: ")


def test_column_conditions_choose_per_cell_and_runs_count_the_shown_runs():
    adam = dict(objective="cosine", solver="adam", solver_schedule="minibatch")  # the paper's "Ours" here
    runs = frame(
        run(1, **adam, avg_acc=0.65, n_prune=4, setting_hash="4"),
        run(2, **adam, avg_acc=0.60, n_prune=8, setting_hash="8"),
        run(3, **adam, avg_acc=0.61, n_prune=8, setting_hash="8"),
        run(4, **adam, avg_acc=0.3, n_prune=8, dtype="float32", setting_hash="8f"),
        run(5, objective="ls", solver=None, solver_schedule=None, avg_acc=0.9, n_prune=4, setting_hash="ls"),
    )
    table = build_table(SPECS["higher_compression"], runs)
    ours = cells(table, "Ours")
    assert ours["Runs"] == 3 and ours["12.5%"] == "0.65" and ours["25%"] == "0.605 ± 0.0071 (n=2)"
    note = "Ours [25%, 25% (7 tasks, with Lambada acc)]: not shown, 1 other setting matched: dtype=float32 (n=1)"
    assert table_notes(table) == [note]


def test_the_higher_compression_table_shows_the_6_and_7_task_averages_past_12_5_percent():
    """The paper's 25% cells are 7-task averages (with Lambada accuracy), its 12.5% ones the figure's
    6-task points; which average its 37.5% and 50% cells are is not said: both are shown there."""
    ours = dict(objective="cosine", solver="adam", solver_schedule="minibatch")
    scores = {4: (0.646, 0.62), 8: (0.634, 0.607), 12: (0.53, 0.51), 16: (0.40, 0.386)}
    runs = frame(
        *(run(n, **ours, n_prune=n, avg_acc=a, avg_acc_all=b, setting_hash=str(n)) for n, (a, b) in scores.items())
    )
    ours = cells(build_table(SPECS["higher_compression"], runs), "Ours")
    seven = " (7 tasks, with Lambada acc)"
    for header, n in (("25%", 8), ("37.5%", 12), ("50%", 16)):
        assert (ours[header], ours[header + seven]) == (str(scores[n][0]), str(scores[n][1])), header
    assert ours["12.5%"] == "0.646" and "12.5%" + seven not in ours


def test_task_columns_read_the_papers_metric_per_task():
    harness = yaml.safe_load((ROOT / "conf/eval/paper.yaml").read_text())["harness"]
    accuracy = {t: m for t, m in (harness.get("metrics") or {}).items() if m not in PERPLEXITY}
    assert [c.metric for c in TASK_COLUMNS] == [f"{metric}_{task}" for task, metric in accuracy.items()]
    sciq = yaml.safe_load((ROOT / "conf/eval/sciq.yaml").read_text())["harness"]["metrics"]
    assert [c.metric for c in SPECS["task_specific"].column_specs()] == [f"{m}_{t}" for t, m in sciq.items()]
    row = run(1, objective="ls", solver=None, solver_schedule=None, eval="sciq", acc_sciq=0.9, acc_norm_sciq=0.8)
    table = build_table(SPECS["task_specific"], frame(row))
    assert table[table["Calibration data"] == "SlimOrca (general)"]["SciQ accuracy"].item() == "0.8"


def test_a_later_failed_rerun_does_not_hide_the_finished_run(tmp_path):
    store = ResultsStore(tmp_path)
    store.write(run(1, config_hash="same", run_id="done", avg_acc=0.6))
    store.write(run(2, config_hash="same", run_id="rerun", status="failed", error="OOM", avg_acc=None))
    store.write(run(3, config_hash="broken", run_id="f1", status="failed", error="first"))
    store.write(run(4, config_hash="broken", run_id="f2", status="failed", error="second"))
    store.write(run(5, config_hash="twice", run_id="old", avg_acc=0.1))
    store.write(run(6, config_hash="twice", run_id="new", avg_acc=0.2))
    latest = store.load(latest_per_config=True).set_index("config_hash")
    assert latest.loc["same", "run_id"] == "done" and latest.loc["same", "status"] == "finished"
    assert latest.loc["broken", "run_id"] == "f2" and latest.loc["broken", "status"] == "failed"
    assert latest.loc["twice", "run_id"] == "new" and len(latest) == 3
    assert len(store.load()) == 6
    assert store.finished_row("same")["run_id"] == "done" and store.finished_row("broken") is None
    table = build_table(SPECS["llama3_main"], store.load(latest_per_config=True))
    assert cells(table, "ReplaceMe", "Linear (Cosine)")["Runs"] == 2  # "same" and "twice"


def llama2_cost(i: int, **values) -> dict:
    base = dict(model="llama2_7b", eval="llama2_table", solver=None, solver_schedule=None, objective="ls")
    return run(i, **{**base, **values})


def test_time_emissions_uses_uncached_runs_only(tmp_path):
    uidl = dict(objective="identity", selection_metric="angular_last", healing="lora")
    runs = frame(
        llama2_cost(1, cached_stages="[]", time_capture_s=10.0, time_estimate_s=2.0, co2_kg_capture=0.002, rp=0.9),
        llama2_cost(2, cached_stages='["baseline_ppl"]', time_capture_s=12.0, time_estimate_s=2.0, rp=0.92),
        # Its selection and statistics came from a cache: a fraction of the cost.
        llama2_cost(3, cached_stages='["selection", "statistics"]', time_capture_s=0.5, time_estimate_s=0.1, rp=0.9),
        llama2_cost(4, cached_stages=None, time_capture_s=1.0, rp=0.9),  # unrecorded: excluded
        # UIDL's cost includes its LoRA healing (time_heal_s); UIDL without healing is another method.
        llama2_cost(5, **uidl, cached_stages="[]", time_capture_s=6.5, time_estimate_s=0.0, time_heal_s=3.5, rp=0.8),
        llama2_cost(6, **uidl, cached_stages='["statistics"]', time_capture_s=0.1, rp=0.8),
        llama2_cost(7, **{**uidl, "healing": "none"}, cached_stages="[]", time_capture_s=6.5, rp=0.7),
    )
    plotted = time_emissions(runs, tmp_path / "time_emissions.png")
    values = plotted.set_index(["panel", "series"])
    assert values.loc[("time_rel_ls", "Ours (LS)"), "n"] == 2
    assert values.loc[("time_rel_ls", "UIDL + LoRA"), "mean"] == pytest.approx((6.5 + 3.5) / 13.0)
    assert values.loc[("rp", "UIDL + LoRA"), "mean"] == pytest.approx(0.8)
    assert values.loc[("excluded", "cached"), "n"] == 2 and values.loc[("excluded", "unrecorded"), "n"] == 1
    assert "uncached runs only" in values.loc[("rp", "UIDL + LoRA"), "note"]
    assert values.loc[("excluded", "cached"), "note"] == (
        "uncached runs only: excluded 2 with cached selection/statistics, 1 without a cached_stages record"
    )
    # Rows from before cached_stages existed: all excluded, and the figure says so.
    old = time_emissions(runs.drop(columns="cached_stages"), tmp_path / "old.png").set_index(["panel", "series"])
    assert old.loc[("excluded", "unrecorded"), "n"] == 7 and "rp" not in old.index.get_level_values(0)


def test_figure_points_average_one_setting_and_note_the_others(tmp_path):
    runs = frame(
        run(1, objective="ls", solver=None, solver_schedule=None, n_calib_samples=1000, avg_acc=0.62, setting_hash="a"),
        run(2, objective="ls", solver=None, solver_schedule=None, n_calib_samples=1000, avg_acc=0.63, setting_hash="a"),
        run(
            3,
            objective="ls",
            solver=None,
            solver_schedule=None,
            n_calib_samples=1000,
            avg_acc=0.2,
            dtype="float32",
            setting_hash="b",
        ),
    )
    plotted = calibration_size(runs, tmp_path / "calibration_size.png")
    point = plotted[(plotted.panel == "avg_acc") & (plotted.series == "LS")].iloc[0]
    assert point["n"] == 2 and point["mean"] == pytest.approx(0.625)
    assert point["note"] == "n_calib_samples=1000: not shown, 1 other setting matched: dtype=float32 (n=1)"


def test_runs_of_other_library_versions_are_not_averaged():
    runs = frame(
        run(1, avg_acc=0.6, setting_hash="s", torch_version="2.13.0"),
        run(2, avg_acc=0.5, setting_hash="s", torch_version="2.14.0"),
    )
    choice = choose_setting(runs)
    assert [g.n for g in choice.groups] == [1, 1]
    assert "torch_version=2.13.0" in choice.note("x")


def leaderboard_run(i: int, model: str, scores: dict, baseline: dict, **values) -> dict:
    base = dict(model=model, eval="leaderboard", objective="ls", solver=None, solver_schedule=None)
    row = run(i, **{**base, **values})
    row.update({f"score_{t}": v for t, v in scores.items()})
    row.update({f"baseline_score_{t}": v for t, v in baseline.items()})
    return row


def test_leaderboard_bars_are_scores_over_the_unpruned_models_per_task(tmp_path):
    baseline = {"leaderboard_bbh": 0.5, "leaderboard_math_hard": 0.1, "leaderboard_gpqa": 0.3}
    runs = frame(
        leaderboard_run(1, "llama2_7b", {"leaderboard_bbh": 0.45, "leaderboard_math_hard": 0.05,
                                         "leaderboard_gpqa": 0.3}, baseline),  # fmt: skip
        leaderboard_run(2, "llama2_7b", {"leaderboard_bbh": 0.40, "leaderboard_math_hard": 0.07,
                                         "leaderboard_gpqa": 0.27}, baseline),  # fmt: skip
        leaderboard_run(3, "llama2_7b", {"leaderboard_bbh": 0.3}, baseline, objective="identity",
                        selection_metric="angular_last"),  # fmt: skip
        # Another suite and another blocks count: not in the figure.
        leaderboard_run(4, "llama2_7b", {"leaderboard_bbh": 0.1}, baseline, eval="paper"),
        leaderboard_run(5, "llama2_7b", {"leaderboard_bbh": 0.1}, baseline, n_prune=4),
    )
    plotted = leaderboard(runs, tmp_path / "leaderboard.png").set_index(["panel", "series", "x"])
    ls = plotted.loc[("llama2_7b", "Ours (LS)")]
    assert ls.loc["leaderboard_bbh", "mean"] == pytest.approx((0.9 + 0.8) / 2) and ls.loc["leaderboard_bbh", "n"] == 2
    assert ls.loc["leaderboard_math_hard", "mean"] == pytest.approx((0.5 + 0.7) / 2)
    assert ls.loc["leaderboard_gpqa", "mean"] == pytest.approx((1.0 + 0.9) / 2)
    uidl = plotted.loc[("llama2_7b", "UIDL")]
    assert list(uidl.index) == ["leaderboard_bbh"] and uidl.loc["leaderboard_bbh", "mean"] == pytest.approx(0.6)
    assert "llama3_8b_instruct" not in plotted.index.get_level_values(0)  # no runs: nothing drawn
    assert (tmp_path / "leaderboard.png").stat().st_size > 0


# One transform per cut (single-cut runs record merge_consecutive=None), and the row columns of
# the other methods as JobSpec writes them.
LS = dict(objective="ls", solver=None, solver_schedule=None, merge_consecutive=None)
UIDL_RUN = dict(
    objective="identity", solver=None, solver_schedule=None, selection_metric="angular_last", merge_consecutive=None
)
NC = dict(num_lts=2, merge_consecutive=False)  # two transforms on cuts never merged
NC4 = dict(num_lts=4, merge_consecutive=False)  # four


def test_structured_lts_shows_uidl_and_the_non_consecutive_row_from_their_own_runs():
    runs = frame(
        run(1, **LS, avg_acc=0.62, ppl_lambada=21.21, rp=0.896),
        run(2, **LS, structure="diagonal", avg_acc=0.61, ppl_lambada=89.09, rp=0.884),
        run(3, **UIDL_RUN, avg_acc=0.58, ppl_lambada=2216.96, rp=0.825),
        run(4, **{**LS, **NC4}, avg_acc=0.6, ppl_lambada=16.07, rp=0.8960),
        run(5, **{**LS, **NC4}, avg_acc=0.64, ppl_lambada=16.09, rp=0.8962, seed=7),  # another seed: averaged
        # Not these rows: LS transforms merged where the cuts touch; the cosine Multi_LT_NC (the
        # main table's); identity on cuts chosen by mean cosine distance (not UIDL's selection); two
        # LS transforms on non-consecutive cuts (the paper's numbers are the 4-LT ones).
        run(6, **{**LS, "num_lts": 4, "merge_consecutive": True}, avg_acc=0.1, ppl_lambada=1.0, rp=0.1),
        run(7, **NC4, avg_acc=0.2, ppl_lambada=2.0, rp=0.2),
        run(8, **{**UIDL_RUN, "selection_metric": "cosine"}, avg_acc=0.3, ppl_lambada=3.0, rp=0.3),
        run(9, **{**LS, **NC}, avg_acc=0.59, ppl_lambada=18.99, rp=0.903),
    )
    table = build_table(SPECS["structured_lts"], runs)
    assert list(table["Setting"]) == [
        "Generic",
        "Diagonal",
        "Orthonormal",
        "UIDL",
        "Generic, non-consecutive (4 LTs)",
    ]
    assert {k: cells(table, "Generic")[k] for k in ("Runs", "Avg-acc", "Perplexity")} == {
        "Runs": 1,
        "Avg-acc": "0.62",
        "Perplexity": "21.21",
    }
    uidl = cells(table, "UIDL")
    assert (uidl["Runs"], uidl["Avg-acc"], uidl["Perplexity"], uidl["RP"]) == (1, "0.58", "2217", "0.825")
    nc = cells(table, "Generic, non-consecutive (4 LTs)")
    assert (nc["Runs"], nc["Avg-acc"], nc["Perplexity"]) == (2, "0.62 ± 0.028 (n=2)", "16.08 ± 0.014 (n=2)")
    assert nc["RP"] == "0.8961 ± 0.00014 (n=2)"
    # No orthonormal run: missing, not borrowed from another row.
    assert cells(table, "Orthonormal")["Runs"] == 0 and cells(table, "Orthonormal")["Avg-acc"] == MISSING
    assert table_notes(table) == []


def test_the_cosine_approximation_table_shows_the_multi_a_rows_from_their_own_runs():
    runs = frame(
        run(1, merge_consecutive=None, avg_acc=0.634, ppl_lambada=15.88),
        run(2, objective="cosine_exact", merge_consecutive=None, avg_acc=0.630, ppl_lambada=16.63),
        run(3, **NC, avg_acc=0.628, ppl_lambada=13.95),
        run(4, **NC, objective="cosine_exact", avg_acc=0.630, ppl_lambada=13.12),
        run(7, **NC4, avg_acc=0.625, ppl_lambada=14.5),
        run(8, **NC4, objective="cosine_exact", avg_acc=0.627, ppl_lambada=13.5),
        # Two transforms on touching cuts merged into one: not Multi_A.
        run(5, num_lts=2, merge_consecutive=True, avg_acc=0.1, ppl_lambada=1.0),
        # Qwen's Multi_A (not in the paper's table): no row takes it.
        run(6, **NC, model="qwen25_7b_instruct", n_prune=7, num_layers=28, avg_acc=0.2, ppl_lambada=2.0),
    )
    table = build_table(SPECS["cosine_approximation"], runs)
    shown = {row["Setting"]: (row["Runs"], row["Perplexity"], row["Avg-acc"]) for row in table.to_dict("records")}
    assert shown == {
        "Llama 3 8B, approx. loss": (1, "15.88", "0.634"),
        "Llama 3 8B, orig. loss": (1, "16.63", "0.63"),
        "Qwen 2.5 7B, approx. loss": (0, MISSING, MISSING),
        "Qwen 2.5 7B, orig. loss": (0, MISSING, MISSING),
        "Llama 3 8B, Multi_A approx. loss, 2 LTs": (1, "13.95", "0.628"),
        "Llama 3 8B, Multi_A orig. loss, 2 LTs": (1, "13.12", "0.63"),
        "Llama 3 8B, Multi_A approx. loss, 4 LTs": (1, "14.5", "0.625"),
        "Llama 3 8B, Multi_A orig. loss, 4 LTs": (1, "13.5", "0.627"),
    }
    assert list(shown)[-4:-2] == ["Llama 3 8B, Multi_A approx. loss, 2 LTs", "Llama 3 8B, Multi_A orig. loss, 2 LTs"]
    assert table_notes(table) == []


def test_time_emissions_says_when_the_emissions_are_estimated(tmp_path, monkeypatch):
    from replaceme_exp.reporting import paper_figures
    from replaceme_exp.reporting.energy_marks import NOTE

    footnotes = []
    monkeypatch.setattr(paper_figures, "_save", lambda fig, path, footnote=None: footnotes.append(footnote))
    cost = dict(cached_stages="[]", time_capture_s=10.0, time_estimate_s=2.0, co2_kg_capture=0.002, rp=0.9)
    time_emissions(frame(llama2_cost(1, **cost, energy_estimated=True)), tmp_path / "estimated.png")
    time_emissions(frame(llama2_cost(1, **cost, energy_estimated=False)), tmp_path / "measured.png")
    assert NOTE in footnotes[0] and NOTE not in footnotes[1]
