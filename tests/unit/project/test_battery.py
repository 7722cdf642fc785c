"""The adversarial battery's classifiers (benchmarks/adversarial.py) on canned outputs: what counts
as a clear refusal, one after the model loaded, a silent acceptance, a crash; a fault's outcome
from a rerun's row against a clean run's."""

from __future__ import annotations

import importlib.util
import sys

from helpers.config import ROOT


_spec = importlib.util.spec_from_file_location("adversarial", ROOT / "benchmarks" / "adversarial.py")
battery = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("adversarial", battery)  # its dataclasses look their module up
_spec.loader.exec_module(battery)

STAGE = "[2026-11-24 13:45:49,371][replaceme_exp.job][INFO] - "
ERROR = "[2026-11-24 13:45:50,521][replaceme_exp][ERROR] - "


def test_a_composition_error_naming_the_key_is_a_clear_refusal_before_loading():
    output = "invalid configuration: calibratoin: not a key (its keys: alpha, calibration, cuts)\n"
    verdict = battery.classify_bad_input(2, output, [], ["calibratoin"])
    assert (verdict.outcome, verdict.after_load, verdict.no_row) == ("refused_clearly", False, False)


def test_a_failed_row_after_the_load_stage_is_a_refusal_after_loading():
    output = (
        f"{STAGE}stage load ...\n{STAGE}stage load done in 1.2 s\n{STAGE}stage data ...\n"
        f"{ERROR}job 878e3ecdcd78 failed in stage data after 10 s: ConfigError: calibration.path='/x/calib.txt': "
        "is not UTF-8 text, row /x/results/runs/abc/878e3ecdcd78.parquet\n"
    )
    rows = [{"status": "failed", "failed_stage": "data", "error": "ConfigError: calibration.path='/x/calib.txt'"}]
    verdict = battery.classify_bad_input(1, output, rows, ["calib.txt"])
    assert (verdict.outcome, verdict.after_load) == ("refused_clearly", True)
    assert "failed_stage=data" in verdict.detail


def test_a_refusal_at_validation_is_before_loading_one_in_the_load_stage_is_not():
    validation = f"{ERROR}job 5a52 failed in stage validation: ConfigError: n_prune=-1: must be positive\n"
    rows = [{"status": "failed", "failed_stage": "validation"}]
    assert battery.classify_bad_input(1, validation, rows, ["n_prune"]).after_load is False
    # a model that loads, then its tokenizer that does not: refused in the load stage, not before it
    in_load = (
        f"{STAGE}stage load ...\n{STAGE}stage load done in 9.0 s\n"
        f"{ERROR}job 0738 failed in stage load after 7 s: ConfigError: model.tokenizer='bogus': choose embedded\n"
    )
    verdict = battery.classify_bad_input(
        1, in_load, [{"status": "failed", "failed_stage": "load"}], ["model.tokenizer"]
    )
    assert (verdict.outcome, verdict.after_load) == ("refused_clearly", True)


def test_the_rows_path_does_not_make_a_refusal_clear():
    # "runs" is in the row's path, not in the reason
    output = f"{ERROR}job 1 failed after 3 s: PermissionError: [Errno 13] Permission denied, row /r/runs/h/1.parquet\n"
    verdict = battery.classify_bad_input(1, output, [{"status": "failed"}], ["runs"])
    assert verdict.outcome == "refused_unclearly"


def test_a_refusal_naming_neither_key_nor_value_is_unclear():
    output = f"{ERROR}job 1 failed in stage load after 9 s: ConfigError: model.pretrained='meta-llama/x': offline\n"
    verdict = battery.classify_bad_input(1, output, [{"status": "failed", "failed_stage": "load"}], ["-m", "sweep"])
    assert verdict.outcome == "refused_unclearly"


def test_a_traceback_is_a_crash_and_no_row_is_said():
    output = (
        'Traceback (most recent call last):\n  File "run.py", line 63, in <module>\n'
        "OverflowError: Python int too large to convert to C long\n"
    )
    verdict = battery.classify_bad_input(1, output, [], ["seed"])
    assert (verdict.outcome, verdict.no_row) == ("crashed", True)
    assert verdict.detail.startswith("OverflowError")
    with_row = battery.classify_bad_input(1, output, [{"status": "failed"}], ["seed"])
    assert (with_row.outcome, with_row.no_row) == ("crashed", False)


def test_a_timeout_or_a_signal_is_a_crash():
    assert battery.classify_bad_input(None, "", [], ["x"]).outcome == "crashed"
    assert battery.classify_bad_input(-9, "", [], ["x"]).outcome == "crashed"


def test_exit_zero_is_accepted_silently_unless_a_warning_names_the_input():
    finished = [{"status": "finished"}]
    silent = battery.classify_bad_input(
        0, f"{STAGE}stage load ...\n{STAGE}stage load done in 1 s\n", finished, ["device_map"]
    )
    assert (silent.outcome, silent.after_load) == ("accepted_silently", True)
    warned = "[2026-11-24][replaceme_exp][WARNING] - model.device_map=bogus is ignored on a CPU\n"
    assert battery.classify_bad_input(0, warned, finished, ["device_map"]).outcome == "accepted_with_warning"


def test_a_fault_is_judged_by_the_rerun_row_against_the_clean_one():
    clean = {"cuts": "[[4, 6]]", "n_prune": 2, "ppl_heldout": 50501.0157, "transform_rms": '{"4-6": 9.67}'}
    same = dict(clean, ppl_heldout=50501.0157 * (1 + 1e-9))
    assert battery.row_differences(clean, same) == []
    wrong = dict(clean, cuts="[[3, 6]]", n_prune=3)
    diffs = battery.row_differences(clean, wrong)
    assert [d.split()[0] for d in diffs] == ["cuts", "n_prune"]
    verdict = battery.classify_fault(diffs, "")
    assert (verdict.outcome, verdict.wrong_finished_row) == ("not", True)
    assert battery.classify_fault([], "").outcome == "survived"
    assert battery.classify_fault([], "", debris=[".x.tmp"]).outcome == "partly"
    assert battery.classify_fault([], "Traceback (most recent call last):\nValueError: x\n").outcome == "partly"
    assert battery.classify_fault(None, "", refused_clearly=True).outcome == "partly"
    assert battery.classify_fault(None, "").outcome == "not"
    lost = battery.classify_fault([], "", model_lost=True)
    assert (lost.outcome, lost.model_lost) == ("not", True)


def test_the_figures_count_each_outcome():
    results = [
        battery.Result("a", "bad_input", "", "refused_clearly", "", 1, after_load=True),
        battery.Result("b", "bad_input", "", "refused_clearly", "", 1),
        battery.Result("c", "bad_input", "", "crashed", "", 1, no_row=True),
        battery.Result("d", "fault", "", "not", "", 1, wrong_finished_row=True),
        battery.Result("e", "security", "Make variables", "vulnerable", "", 1),
        battery.Result("f", "security", "Make variables: CALIBRATION", "vulnerable", "", 1),
        battery.Result("g", "security", "row values that become paths", "safe", "", 1),
    ]
    figures = battery.figures(results)
    assert figures["bad_inputs"]["refused_clearly"] == 2
    assert figures["bad_inputs"]["refused_clearly_after_load"] == 1
    assert figures["bad_inputs"]["crashed_leaving_no_row"] == 1
    assert figures["faults"]["wrong_finished_rows"] == 1
    assert figures["security"]["vulnerable"] == 2
    assert figures["security"]["items_vulnerable"] == 1


def test_every_probe_has_a_unique_name_and_a_known_category():
    names = [p.name for p in battery.PROBES]
    assert len(names) == len(set(names))
    assert {p.category for p in battery.PROBES} == {"bad_input", "fault", "security"}
