"""Progress of long loops: a bar on a terminal, log lines a person can follow in a file, and lm-eval
quiet about the project's own tasks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers.config import ROOT


@pytest.mark.parametrize("first", ["", "import huggingface_hub", "import transformers"])
def test_library_bars_are_turned_off_in_log_mode_without_importing_transformers(first):
    """In log mode, transformers' and huggingface_hub's bars are off whether they are imported
    before or after (the first stage imports them); turning them off imports neither (about 0.5 s)."""
    code = f"""
import sys
{first}
from replaceme_exp.progress import configure, quiet_library_bars
before = sorted(m for m in ("transformers", "huggingface_hub") if m in sys.modules)
configure(mode="log")
quiet_library_bars()
after = sorted(m for m in ("transformers", "huggingface_hub") if m in sys.modules)
import transformers
from huggingface_hub.utils import are_progress_bars_disabled
print(before == after, transformers.utils.logging.is_progress_bar_enabled(), are_progress_bars_disabled())
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith("DISABLE_PROGRESS_BARS")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False", "True"]
