"""W&B as a team reads it: metrics logged as they are produced, sample tables, one group per
sweep, the offline run file read back, a sync that fails fast offline and writes nothing where it
is run, and a workspace definition built without a server."""

from __future__ import annotations

import pytest
from helpers.wandb_dashboards import sweep_rows
from omegaconf import OmegaConf

from replaceme_exp.runtime.sweep_name import sweep_name, sweep_overrides
from replaceme_exp.tracking.wandb_offline import record_bytes


def test_a_sweep_over_presets_is_one_group(tmp_path):
    """Every job of a sweep over two presets has one sweep name, so one W&B group (the row's
    ``sweep_group``); a preset the sweep does not vary still names it; a template names it first."""
    (tmp_path / "multirun.yaml").write_text(
        OmegaConf.to_yaml({"hydra": {"overrides": {"task": ["experiment=replaceme_ls,uidl_baseline", "seed=1"]}}})
    )
    swept = sweep_overrides(tmp_path)
    names = {sweep_name({"experiment": preset}, True, swept) for preset in ("replaceme_ls", "uidl_baseline")}
    assert names == {"experiment=replaceme_ls,uidl_baseline"}
    assert sweep_name({"experiment": "uidl_baseline"}, True, ["seed=1,2"]) == "experiment/uidl_baseline"
    assert sweep_name({"paper": "table1", "experiment": "x"}, True, ["experiment=a,b"]) == "paper/table1"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "multirun.yaml").write_text(
        OmegaConf.to_yaml({"hydra": {"overrides": {"task": []}, "sweeper": {"params": {"+experiment": "a,b"}}}})
    )
    assert sweep_name({"experiment": "a"}, True, sweep_overrides(tmp_path / "t")) == "experiment=a,b"


def test_the_reader_refuses_a_file_that_is_not_a_run_and_stops_at_a_torn_record(tmp_path):
    bad = tmp_path / "run-x.wandb"
    bad.write_bytes(b"not a run file")
    with pytest.raises(ValueError, match="not a W&B run file"):
        list(record_bytes(bad))
    import struct
    import zlib

    def chunk(kind: int, body: bytes) -> bytes:
        return struct.pack("<IHB", zlib.crc32(bytes([kind]) + body), len(body), kind) + body

    good = tmp_path / "run-y.wandb"
    header = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
    good.write_bytes(header + chunk(1, b"one") + chunk(2, b"tw") + chunk(4, b"o") + chunk(1, b"three")[:-2])
    assert list(record_bytes(good)) == [b"one", b"two"]


def test_the_workspace_of_a_sweep_selects_its_group_and_plots_what_it_varies():
    from replaceme_exp.reporting.wandb_dashboard import build_workspace, describe

    workspace = build_workspace(sweep_rows(), "team", "replaceme-exp")
    runset = workspace.runset_settings
    assert "sweep 2026-01-01_10-00-00" in str(runset.filters) and "Group" in str(runset.filters)
    assert [g.name for g in runset.groupby] == ["setting.objective"]
    sections = {s.name: s for s in workspace.sections}
    assert list(sections) == ["Quality", "As it ran", "Cost", "Samples"]
    titles = [getattr(p, "title", None) for p in sections["Quality"].panels]
    assert "ppl_heldout vs objective" in titles and "ppl_heldout_baseline vs objective" not in titles
    regexes = [p.metric_regex for p in sections["As it ran"].panels]
    assert "^stage/.*_s$" in regexes and "^progress/.*" in regexes
    assert [p.table_name for p in sections["Samples"].panels] == ["samples/calibration_generated", "samples/generation"]
    workspace._to_model()  # the view W&B would store, built without a server
    assert describe(workspace)[0] == "workspace 'ReplaceMe sweep sweep 2026-01-01_10-00-00' of team/replaceme-exp"
