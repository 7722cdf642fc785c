"""``make bench``'s script (benchmarks/bench_capture.py) runs on a tiny model and prints its JSON: it
had stopped importing when the pipeline was restructured, and nothing ran it. Its speed section
(the unpruned model against plain removal and a separate T) reports every ratio with its range."""

from __future__ import annotations

import sys

import pytest
from helpers.config import ROOT


def test_only_names_the_sections_to_run_and_leaves_the_overrides_to_hydra():
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_capture import SECTIONS, parse_args

    assert parse_args(["model=tiny_llama", "--only", "startup,capture", "n_prune=2"]) == (
        ["model=tiny_llama", "n_prune=2"],
        ("startup", "capture"),
    )
    assert parse_args(["--only=capture"]) == ([], ("capture",))
    assert parse_args(["n_prune=2"]) == (["n_prune=2"], SECTIONS)
    for bad in (["--only", "captures"], ["--only="], ["--only"]):
        with pytest.raises(SystemExit, match="choose one or more of capture, statistics"):
            parse_args(bad)
