"""CITATION.cff (Citation File Format 1.2.0) names this software and the paper, and LICENSE is Apache-2.0."""

from __future__ import annotations

import pytest
import yaml
from helpers.config import ROOT


CFF = ROOT / "CITATION.cff"
# As the paper's source states them (replaceme_paper.tex: \title, \author; arXiv 2505.02819).
TITLE = "ReplaceMe: Network Simplification via Depth Pruning and Transformer Block Linearization"
AUTHORS = ["Shopkhoev", "Ali", "Zhussip", "Malykh", "Lefkimmiatis", "Komodakis", "Zagoruyko"]


def test_citation_cff_has_the_keys_cff_1_2_0_requires():
    cff = yaml.safe_load(CFF.read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "authors"):
        assert cff[key], key
    assert all(isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in cff["authors"])
    assert cff["type"] == "software" and cff["license"] == "Apache-2.0"


def test_the_preferred_citation_is_the_paper():
    paper = yaml.safe_load(CFF.read_text())["preferred-citation"]
    for key in ("type", "title", "authors"):
        assert paper[key], key
    assert [a["family-names"] for a in paper["authors"]] == AUTHORS
    assert paper["year"] == 2025 and "2505.02819" in paper["url"]
    assert paper["title"] == TITLE


def test_citation_cff_validates_against_the_schema():
    validate = pytest.importorskip("cffconvert.cli.validate_or_write_output", reason="cffconvert is not installed")
    from cffconvert.cli.create_citation import create_citation

    citation = create_citation(str(CFF), None)
    validate.validate_or_write_output(None, None, True, citation)  # raises on an invalid file


def test_the_license_is_apache_2_0():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
