"""What the unit and integration tests of integrity config share: fixtures, builders and constants."""

from __future__ import annotations

import pytest
from helpers.jobs import job_config

import replaceme_exp.pipeline.job as pipeline_job
import replaceme_exp.runtime.runner as runner
from replaceme_exp.runtime import run_recorded


@pytest.fixture
def no_model_loads(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a model was loaded for a bad configuration")

    monkeypatch.setattr(pipeline_job, "load_model", never)
    monkeypatch.setattr(runner, "weights_fingerprint", never)


def refused(tmp_path, *overrides, given: list[str] | None = None) -> str:
    """The error of the failed row a job with ``overrides`` leaves (``given``: as if typed on the
    command line); asserts it is one line of a refusal before anything ran."""
    row = run_recorded(job_config(tmp_path, *overrides), raise_on_failure=False, overrides=given)
    assert row["status"] == "failed" and row["failed_stage"] == "validation", row
    assert row["error"].startswith("ConfigError: ") and "\n" not in row["error"]
    return row["error"].removeprefix("ConfigError: ")
