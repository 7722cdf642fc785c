"""The table "depth-pruning methods at equal compression" and the runs of quoted methods in this
project's pipeline: its template gives every method the same calibration tokens and suite at 25% of
the blocks, each of its jobs fills exactly one row, the table renders from rows (a method without a
run is missing, a run at another compression is not shown), the compression time and CO2 sum the
compression stages, and a quoted method's run stands beside its quoted row, labelled apart."""

from __future__ import annotations

import pytest
from helpers.tables import smollm2_run


def test_render_paper_only_writes_the_named_table_and_refuses_unknown_names(tmp_path):
    from replaceme_exp.reporting.render_paper import main
    from replaceme_exp.results import ResultsStore

    store = ResultsStore(tmp_path / "results")
    store.write(smollm2_run(1, "UIDL", ppl_heldout=62.2))
    out = tmp_path / "tables"
    main(["--results", str(tmp_path / "results"), "--out", str(out), "--only", "methods_equal_compression"])
    assert sorted(p.name for p in out.iterdir()) == ["methods_equal_compression.md", "methods_equal_compression.tex"]
    assert "| UIDL | uidl_baseline | 1 | 62.2 |" in (out / "methods_equal_compression.md").read_text()
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path / "results"), "--out", str(out), "--only", "no_such_table"])
