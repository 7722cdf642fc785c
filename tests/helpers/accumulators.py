"""What the unit and integration tests of accumulators share: fixtures, builders and constants."""

from __future__ import annotations

import re
import sys
import types

import pytest
from helpers.config import ROOT

from replaceme_exp.methods import METHODS
from replaceme_exp.selection.metrics import METRICS


PAGE = ROOT / "docs" / "extending" / "statistic.md"


@pytest.fixture
def sublayer_cosine(tmp_path):
    """The page's module, registered as a file of replaceme_exp/methods/ would be, and its YAML on Hydra's
    search path; both gone afterwards."""
    page = PAGE.read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    option = re.search(r"```yaml\n(.*?)```", page, re.S).group(1)
    module = types.ModuleType("replaceme_exp.methods.sublayer_cosine")
    sys.modules[module.__name__] = module
    exec(compile(code, "replaceme_exp/methods/sublayer_cosine.py", "exec"), module.__dict__)
    (tmp_path / "conf" / "selection").mkdir(parents=True)
    (tmp_path / "conf" / "selection" / "sublayer_cosine.yaml").write_text(option)
    yield module, f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    METRICS.remove("sublayer_cosine")
    METHODS.remove("sublayer_cosine")
    sys.modules.pop(module.__name__)
