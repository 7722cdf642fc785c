"""Each depth-pruning method is one plugin (replaceme_exp/methods/): it has its docs page and presets,
every preset belongs to one method, and the row's ``method`` is the plugin's name for the job."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.config import ROOT, compose_config

from replaceme_exp.methods import METHODS, method_of_objective, method_of_selection
from replaceme_exp.pipeline.spec import JobSpec


PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def test_every_method_has_its_docs_page_and_its_presets():
    assert {name for name, _ in METHODS.items()} == {
        "replaceme_ls",
        "replaceme_numerical",
        "ridge_identity",
        "uidl",
        "shortgpt",
        "sleb",
        "laco",
        "linearpatch",
        "llm_streamline",
    }
    for name, method in METHODS.items():
        page = ROOT / "docs" / "methods" / method.docs
        assert page.is_file(), f"{name}: no {page}"
        assert method.presets and set(method.presets) <= set(PRESETS), name
        assert (method.search_label is not None) == bool(method.selections), name


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_belongs_to_one_method_which_names_its_rows(preset):
    owners = [m for _, m in METHODS.items() if preset in m.presets]
    assert len(owners) == 1, f"{preset}: {[m.name for m in owners]}"
    spec = JobSpec.from_config(compose_config([f"experiment={preset}"]))
    found = (method_of_objective(spec.config.objective), method_of_selection(spec.config))
    assert owners[0] in found
    method = spec.setting_columns()["method"]
    shown = owners[0].search_label if owners[0].selections else owners[0].label
    assert isinstance(method, str) and method
    if owners[0].selections:
        assert method.startswith(shown) or f"on {shown} cuts" in method


def test_an_objective_no_method_declares_is_named_by_its_objective(monkeypatch):
    from replaceme_exp.estimation.estimators import LeastSquaresEstimator
    from replaceme_exp.methods import plugin

    class Mine(LeastSquaresEstimator):
        pass

    monkeypatch.setattr(plugin, "estimator_class", lambda objective: object)
    cfg = JobSpec.from_config(compose_config(["objective=ls"])).config
    assert plugin.label_of(cfg, "cosine") == "ls"
    monkeypatch.setattr(plugin, "estimator_class", lambda objective: Mine)
    assert plugin.label_of(cfg, "cosine") == "ReplaceMe LS"  # a subclass is its parent's method
    assert Path(plugin.__file__).parent.name == "methods"


SPINE = (
    "replaceme_exp/pipeline",
    "replaceme_exp/config/schema.py",
    "replaceme_exp/surgery.py",
    "replaceme_exp/reporting",
)


def test_the_spine_names_no_method():
    """The pipeline (its rules included), the schema, the surgery and the reports mention no registered
    method, by its key or its name in tables or prose, in code or docs (the paper's tables and figures
    name theirs in reporting/paper.yaml, data)."""
    import re

    words = {w for _, m in METHODS.items() for w in (m.name, m.title, m.search_label) if w}
    pattern = re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)), re.I)
    files = [p for place in SPINE for p in ([ROOT / place] if place.endswith(".py") else (ROOT / place).glob("*.py"))]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert len(files) > 10 and not found, found
