"""paper.yaml, the paper's tables and figures as data: how its conditions resolve, and that a bad entry is
refused by name."""

from __future__ import annotations

import pytest

from replaceme_exp.reporting.cells import ANY, FractionOfDepth
from replaceme_exp.reporting.paper_records import conditions, paper_records, setting
from replaceme_exp.reporting.paper_tables import TABLES, table_spec


RECORDS = """
settings:
  base: {a: 1, b: 2, c: 3}
  over: {use: base, b: 20, d: !any ''}
tables: []
"""


def write(tmp_path, text: str = RECORDS, name: str = "paper.yaml"):
    path = tmp_path / name  # paper_records caches by path: one file per content
    path.write_text(text)
    return path


def test_use_merges_in_place_as_a_python_dict_would(tmp_path):
    path = write(tmp_path)
    assert setting("over", path) == {"a": 1, "b": 20, "c": 3, "d": ANY}
    resolved = conditions({"x": 0, "use": "base", "a": 9}, "here", path)
    assert list(resolved.items()) == list({"x": 0, **{"a": 1, "b": 2, "c": 3}, "a": 9}.items())
    # A list of mappings merges in order: a second `use` after other keys.
    resolved = conditions([{"use": "base", "e": 5}, {"use": "over"}], "here", path)
    assert list(resolved.items()) == [("a", 1), ("b", 20), ("c", 3), ("e", 5), ("d", ANY)]
    assert conditions({"use": ["base"], "without": ["b", "c"], "z": 1}, "here", path) == {"a": 1, "z": 1}
    assert conditions(None, "here", path) == {}


def test_the_tags_and_refusals(tmp_path):
    path = write(
        tmp_path,
        RECORDS.replace(
            "tables: []", "tables: []\nfigures: {f: [{label: x, conditions: {n: !fraction_of_depth 0.375}}]}"
        ),
    )
    assert paper_records(path)["figures"]["f"][0]["conditions"]["n"] == FractionOfDepth(0.375)
    with pytest.raises(ValueError, match=r"here: use='nope' names no earlier setting"):
        conditions({"use": "nope"}, "here", path)
    with pytest.raises(ValueError, match="conditions must be a mapping"):
        conditions(["a"], "here", path)
    with pytest.raises(ValueError, match=r"unknown section\(s\) \['tabels'\]"):
        paper_records(write(tmp_path, RECORDS.replace("tables:", "tabels:"), "misspelt.yaml"))
    with pytest.raises(ValueError, match=r"tables.t: unknown key\(s\) \['colums'\]"):
        table_spec({"name": "t", "caption": "c", "where": {}, "rows": [], "colums": []})
    with pytest.raises(ValueError, match=r"tables.t row: unknown key\(s\) \['condtions'\]"):
        table_spec({"name": "t", "caption": "c", "where": {}, "rows": [{"label": "r", "condtions": {"a": 1}}]})


def test_every_table_reads_its_named_settings():
    """The shipped file: each table once, ``use`` resolved everywhere (no ``use``/``without`` key left),
    the peer rows lifting their settings with ANY, the methods tables at a fraction of the depth."""
    names = [spec.name for spec in TABLES]
    assert len(names) == len(set(names)) == len(paper_records()["tables"])
    for spec in TABLES:
        mappings = [spec.where, spec.home] + [r.conditions for r in spec.row_specs()]
        mappings += [c.conditions for c in spec.column_specs("paper")]
        assert not any({"use", "without"} & set(m) for m in mappings), spec.name
    main = next(spec for spec in TABLES if spec.name == "llama3_main")
    assert main.where == {**setting("default_method"), "model": "llama3_8b_instruct", "n_prune": 8, "eval": "paper"}
    peers = [r for r in main.row_specs() if "method" in r.conditions]
    assert peers and all(r.conditions["n_calib_samples"] is ANY for r in peers)
    methods = [spec for spec in TABLES if spec.name.startswith("methods_equal_compression")]
    assert [spec.where["n_prune"] for spec in methods] == [FractionOfDepth(0.25), FractionOfDepth(0.375)]
