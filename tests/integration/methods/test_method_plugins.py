"""Each depth-pruning method is one plugin (replaceme_exp/methods/): it has its docs page and presets,
every preset belongs to one method, and the row's ``method`` is the plugin's name for the job."""

from __future__ import annotations

import pytest
from helpers.config import ROOT

from replaceme_exp.methods import METHODS


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
