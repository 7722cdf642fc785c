"""Each depth-pruning method is one plugin (replaceme_exp/methods/): it has its docs page and presets,
every preset belongs to one method, and the row's ``method`` is the plugin's name for the job."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.config import ROOT, compose_config

from replaceme_exp.methods import METHODS, method_of_objective, method_of_selection
from replaceme_exp.pipeline.spec import JobSpec

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.fixture
def before_last(tmp_path):
    """docs/extending/method.md's worked example, as the page gives it: its plugin module (the page's
    Python block) and its option (the page's YAML block, on Hydra's search path)."""
    import re
    import sys
    import types

    from replaceme_exp.config import schema
    from replaceme_exp.config.store import register_schemas
    from replaceme_exp.selection.metrics import METRICS

    page = (ROOT / "docs" / "extending" / "method.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    option = re.search(r"```yaml\n(.*?)```", page, re.S).group(1)
    shapes = schema.GROUP_SHAPES["selection"]
    module = types.ModuleType("replaceme_exp.methods.before_last")
    sys.modules[module.__name__] = module
    exec(compile(code, "replaceme_exp/methods/before_last.py", "exec"), module.__dict__)
    register_schemas()
    (tmp_path / "conf" / "selection").mkdir(parents=True)
    (tmp_path / "conf" / "selection" / "before_last.yaml").write_text(option)
    yield f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    METRICS.remove("before_last")
    METHODS.remove("before_last")
    sys.modules.pop(module.__name__)
    schema.GROUP_SHAPES["selection"] = shapes


@pytest.mark.integration
@pytest.mark.slow
def test_a_new_method_is_one_python_file_and_one_yaml(tmp_path, before_last):
    """The page's method, through the public API alone: its job removes the blocks just below the
    last, names itself in the row, records its setting, and prunes the model exactly as removing
    those blocks by hand (explicit cuts, another code path) does."""
    from helpers.jobs import job_config

    from replaceme_exp.runtime import run_recorded

    row = run_recorded(
        job_config(tmp_path / "a", before_last, "selection=before_last", "objective=identity", "n_prune=2")
    )
    assert row["status"] == "finished", row["error"]
    layers = row["num_layers"]
    assert row["method"] == "Before-last" and row["cuts"] == [[layers - 3, layers - 1]]
    assert row["before_last_keep"] == 1 and row["selection_keep_last"] == 1 and row["before_last_top"] == layers - 1
    by_hand = run_recorded(job_config(tmp_path / "b", f"cuts=[[{layers - 3},{layers - 1}]]", "objective=identity"))
    assert by_hand["method"] == "block removal" and by_hand["kept_blocks"] == row["kept_blocks"]
    assert row["ppl_heldout"] == by_hand["ppl_heldout"]


SPINE = (
    "replaceme_exp/pipeline",
    "replaceme_exp/config/schema.py",
    "replaceme_exp/surgery.py",
    "replaceme_exp/reporting",
)


@pytest.mark.unit
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
