"""Each run against a reference method, paired (replaceme_exp/reporting/paired.py): rows built from
windows and items with known differences."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from helpers.tables import measured

from replaceme_exp.intervals import paired_means
from replaceme_exp.reporting.paired import labels, main, paired_table, to_markdown
from replaceme_exp.results import ResultsStore


def runs() -> pd.DataFrame:
    return pd.DataFrame(
        [
            measured(1, "LinearPatch", 1.00, (300, 200)),
            measured(2, "LinearPatch", 1.20, (310, 200), objective="other"),  # best on accuracy only
            measured(3, "ShortGPT", 1.05, (290, 200)),  # 5% worse on every window: behind
            measured(4, "ReplaceMe LS", 1.001, (310, 200), noise=0.05),  # within noise on both
            measured(5, "ReplaceMe LS", 0.95, (250, 150), estimation_tokens="rescale_massive"),  # ahead, behind
            measured(6, "ReplaceMe LS", 1.0, (300, 200), model="gemma3_270m"),  # no reference on that model
        ]
    )


def ppl(i: int) -> float:
    return float(runs().set_index("run_id").loc[f"r{i}", "ppl_heldout"])


def test_each_run_is_compared_with_the_references_best_run_on_each_metric():
    table = paired_table(runs(), "LinearPatch").set_index("label")
    assert list(table.index) == [
        "LinearPatch [objective=ls]",
        "LinearPatch [objective=other]",
        "ShortGPT",
        "ReplaceMe LS [estimation_tokens=all]",
        "ReplaceMe LS [estimation_tokens=rescale_massive]",
    ]  # each of LinearPatch's runs is its best on one metric and is compared on the other; the Gemma
    # run has no reference on its model
    lp1 = table.loc["LinearPatch [objective=ls]"]
    assert lp1["ppl_heldout_verdict"] == "reference" and lp1["avg_acc_verdict"] == "behind" and not lp1["level"]
    lp2 = table.loc["LinearPatch [objective=other]"]
    assert lp2["avg_acc_verdict"] == "reference" and lp2["ppl_heldout_verdict"] == "behind"
    sg = table.loc["ShortGPT"]
    assert sg["ppl_heldout_vs"] == pytest.approx(sg["ppl_heldout"] / ppl(1))  # the ppl-best reference: run 1
    assert sg["ppl_heldout_verdict"] == "behind"
    assert sg["ppl_heldout_vs_method"].startswith("paired")
    assert not sg["level"]
    tie = table.loc["ReplaceMe LS [estimation_tokens=all]"]
    assert tie["ppl_heldout_verdict"] == "level" and tie["avg_acc_verdict"] == "level" and tie["level"]
    mixed = table.loc["ReplaceMe LS [estimation_tokens=rescale_massive]"]
    assert mixed["ppl_heldout_verdict"] == "ahead" and mixed["avg_acc_verdict"] == "behind" and not mixed["level"]


def test_the_references_best_run_on_one_metric_is_level_when_within_the_margin_on_the_other():
    """LinearPatch's perplexity-best run has one item fewer right than its accuracy-best run: within
    noise and the margin, so it is level (the reference on one metric, level on the other)."""
    frame = pd.DataFrame(
        [measured(1, "LinearPatch", 1.00, (300, 200)), measured(2, "LinearPatch", 1.20, (301, 200), objective="x")]
    )
    table = paired_table(frame, "LinearPatch").set_index("label")
    first = table.loc["LinearPatch [objective=ls]"]
    assert first["ppl_heldout_verdict"] == "reference" and first["avg_acc_verdict"] == "level" and first["level"]
    assert not table.loc["LinearPatch [objective=x]", "level"]  # 1.2x the NLL: behind on perplexity


def test_the_accuracy_difference_is_the_paired_difference_of_the_items():
    """Against an independent computation: the mean over tasks of each task's item difference,
    LinearPatch's accuracy-best run (310 and 200 of 400 right) as the reference."""
    table = paired_table(runs(), "LinearPatch").set_index("label")
    got = table.loc["ShortGPT"]
    ours = [np.r_[np.ones(n), np.zeros(400 - n)] for n in (290, 200)]
    ref = [np.r_[np.ones(n), np.zeros(400 - n)] for n in (310, 200)]
    expected = paired_means(ours, ref)
    assert got["avg_acc_vs"] == pytest.approx(np.mean([a.mean() - b.mean() for a, b in zip(ours, ref)]))
    assert (got["avg_acc_vs_low"], got["avg_acc_vs_high"]) == pytest.approx((expected.low, expected.high))
    assert got["ppl_heldout_vs"] == pytest.approx(got["ppl_heldout"] / ppl(1), rel=1e-12)  # same tokens


def test_labels_name_only_the_settings_that_differ_within_a_method():
    frame = runs()
    named = labels(frame)
    assert named[2] == "ShortGPT"
    assert named[0] == "LinearPatch [objective=ls]" and named[1] == "LinearPatch [objective=other]"


def test_a_setting_that_differs_only_between_compressions_names_nothing():
    frame = pd.DataFrame(
        [
            measured(1, "SLEB", 1.0, (300, 200), n_prune=8, num_lts=4),
            measured(2, "SLEB", 1.5, (250, 200), n_prune=11, num_lts=3),
            measured(3, "ReplaceMe LS", 1.0, (300, 200), n_prune=11, num_lts=1),
            measured(4, "ReplaceMe LS", 0.9, (300, 200), n_prune=11, num_lts=3),
        ]
    )
    named = labels(frame)
    assert list(named[:2]) == ["SLEB", "SLEB"]  # 4 and 3 cuts: what each compression found
    assert list(named[2:]) == ["ReplaceMe LS [num_lts=1]", "ReplaceMe LS [num_lts=3]"]  # beside each other


def test_the_command_writes_markdown_and_json_and_names_a_wrong_reference(tmp_path, capsys):
    store = ResultsStore(tmp_path / "results")
    for _, row in runs().iterrows():
        store.write({k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))})
    out = tmp_path / "paired.md"
    main(["--results", str(tmp_path / "results"), "--reference", "LinearPatch", "--out", str(out)])
    text = out.read_text()
    assert "### smollm2_135m, 8 blocks removed: each run against LinearPatch's best" in text
    assert "| ShortGPT |" in text and f"{ppl(3) / ppl(1):.3f} [" in text and "behind" in text
    assert "+0.000" not in text.split("| ShortGPT |")[1].split("\n")[0]  # ShortGPT's accuracy: -0.025
    assert "-0.025 [" in text.split("| ShortGPT |")[1].split("\n")[0]
    assert len(json.loads(out.with_suffix(".json").read_text())) == 5  # the Gemma run has no reference
    with pytest.raises(SystemExit, match="--reference 'SLEB': no run of that method"):
        main(["--results", str(tmp_path / "results"), "--reference", "SLEB"])
    assert to_markdown(paired_table(runs(), "LinearPatch"), "LinearPatch") in capsys.readouterr().out


def test_a_collapsed_runs_perplexity_and_ratio_print_with_four_significant_digits():
    frame = pd.DataFrame(
        [
            measured(1, "LinearPatch", 1.0, (300, 200)),
            measured(3, "ShortGPT", 1.05, (290, 200)),
            measured(7, "LLM-Streamline (FFN)", 14.0, (100, 50)),
        ]
    )
    table = paired_table(frame, "LinearPatch").set_index("label")
    lines = to_markdown(table.reset_index(), "LinearPatch").splitlines()
    collapsed = table.loc["LLM-Streamline (FFN)"]
    assert collapsed["ppl_heldout"] > 1e6 and collapsed["ppl_heldout_vs"] > 1e6
    line = next(line for line in lines if line.startswith("| LLM-Streamline"))
    low, high = collapsed["ppl_heldout_ci_low"], collapsed["ppl_heldout_ci_high"]
    assert f"| {collapsed['ppl_heldout']:.4g} [{low:.4g}, {high:.4g}] |" in line
    assert f"| {collapsed['ppl_heldout_vs']:.4g} [" in line and "behind" in line
    assert ".0 [" not in line  # no run of integer digits ending in a decimal
    ordinary = next(line for line in lines if line.startswith("| ShortGPT"))
    assert f"| {table.loc['ShortGPT', 'ppl_heldout']:.1f} [" in ordinary  # ordinary values keep their decimals
    assert f"| {table.loc['ShortGPT', 'ppl_heldout_vs']:.3f} [" in ordinary


def test_runs_of_one_method_that_differ_in_its_own_setting_are_named_by_it():
    frame = runs()
    frame["replacement_epochs"] = None
    frame["replacement_settings"] = None
    for i, epochs in ((3, 1), (2, 37)):
        frame.loc[i, ["method", "replacement_epochs", "replacement_settings"]] = (
            "LLM-Streamline (FFN)",
            epochs,
            json.dumps({"epochs": epochs, "lr": 2e-4}),
        )
    named = labels(frame)
    assert named[3] == "LLM-Streamline (FFN) [replacement_epochs=1]"  # not its JSON settings
    assert named[2] == "LLM-Streamline (FFN) [replacement_epochs=37]"
    assert named[0] == "LinearPatch [objective=ls]"  # no other method's columns in its label
