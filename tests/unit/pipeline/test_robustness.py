"""Nothing wrong, nothing lost: bad input refused before any model loads, rows and models that
survive kills, full disks, concurrent identical jobs and broken row files."""

from __future__ import annotations

import os
from pathlib import Path
import threading

import pandas as pd
import pytest
from helpers.config import CONF
from helpers.jobs import job_config

import replaceme_exp.pipeline.job as pipeline_job
import replaceme_exp.runtime.runner as runner
from replaceme_exp.config.validate import typed_config
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded
from replaceme_exp.surgery import recover_checkpoint, replace_directory


BAD_INPUTS = [
    ("calibration.padding_side=middle", "calibration.padding_side='middle'"),
    ("merge_consecutive=abc", "merge_consecutive='abc'"),
    ("cuts=[[true,3]]", "cuts=[[True, 3]]"),
    ("cuts=5", "cuts=5"),
    ("capture.passes=bogus", "capture.passes='bogus'"),
    ("tracking.wandb.mode=bogus", "tracking.wandb.mode='bogus'"),
    ("alpha=abc", "alpha='abc'"),
    ("alpha=nan", "alpha=nan"),
    ("alpha=inf", "alpha=inf"),
    ("seed=abc", "seed='abc'"),
    ("eval.batch_size=0", "eval.batch_size=0"),
    ("eval.batch_size=-1", "eval.batch_size=-1"),
    ("model.device=bogus", "model.device='bogus'"),
    ("objective=cosine objective.epochs=0", "objective.epochs=0"),
    ("objective=cosine objective.batch_tokens=0", "objective.batch_tokens=0"),
    ("objective=cosine objective.chunk_tokens=0", "objective.chunk_tokens=0"),
    ("objective=cosine objective.lr=-1", "objective.lr=-1"),
    ("mask_ratio=2", "mask_ratio=2"),
    ("num_lts=0", "num_lts=0"),
]


@pytest.mark.parametrize("override, named", BAD_INPUTS)
def test_bad_input_is_refused_before_any_model_loads(tmp_path, monkeypatch, override, named):
    def never(*args, **kwargs):
        raise AssertionError("a model was loaded for a bad configuration")

    monkeypatch.setattr(pipeline_job, "load_model", never)
    monkeypatch.setattr(runner, "weights_fingerprint", never)
    row = run_recorded(job_config(tmp_path, *override.split()), raise_on_failure=False)
    assert row["status"] == "failed" and row["error"].startswith(f"ConfigError: {named}:"), row["error"]
    assert "\n" not in row["error"]
    stored = ResultsStore(tmp_path).load()
    assert len(stored) == 1 and stored.iloc[0]["status"] == "failed"


@pytest.mark.parametrize("key", ["results_dir", "cache_dir"])
def test_a_results_or_cache_dir_that_is_a_file_is_refused_first(tmp_path, key):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    row = run_recorded(job_config(tmp_path, f"{key}={blocker}/sub"), raise_on_failure=False)
    assert row["status"] == "failed" and row["error"].startswith(f"ConfigError: {key}=") and "is a file" in row["error"]


def test_an_unreadable_row_file_is_skipped_with_a_warning(tmp_path, caplog):
    store = ResultsStore(tmp_path)
    store.write({"run_id": "a", "config_hash": "h1", "status": "finished", "started_at": "1"})
    broken = tmp_path / "runs" / "h2" / "b.parquet"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"PAR1 truncated")
    (tmp_path / "runs" / "h2" / "c.parquet").write_bytes(b"")
    with caplog.at_level("WARNING"):
        table = store.load(latest_per_config=True)
    assert list(table["run_id"]) == ["a"]
    assert "b.parquet" in caplog.text and "c.parquet" in caplog.text


def test_a_full_disk_while_writing_a_row_leaves_no_partial_file(tmp_path, monkeypatch):
    def full_disk(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"PAR1")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_disk)
    with pytest.raises(OSError, match="No space left"):
        ResultsStore(tmp_path).write({"run_id": "a", "config_hash": "h", "status": "finished"})
    assert list((tmp_path / "runs" / "h").iterdir()) == []


def finished_and_new_model(tmp_path, old: str, new: str):
    """A finished model directory ``model`` and a new one ``new`` to replace it (config.json each)."""
    directories = []
    for name, text in (("model", old), ("new", new)):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text(text)
        directories.append(directory)
    return tuple(directories)


def test_a_save_killed_between_renames_loses_no_model(tmp_path, monkeypatch):
    target, new = finished_and_new_model(tmp_path, '{"old": true}', '{"new": true}')
    real_rename = os.rename

    def killed(src, dst):  # the process dies right after the finished model was moved aside
        real_rename(src, dst)
        if str(src) == str(target):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        replace_directory(new, target)
    monkeypatch.setattr(os, "rename", real_rename)
    assert not target.exists()  # the moment a kill used to lose the model for good
    assert recover_checkpoint(target) and (target / "config.json").read_text() == '{"old": true}'
    assert not list(tmp_path.glob(".old-*"))


def test_identical_saves_at_once_do_not_fail_and_keep_one_model(tmp_path):
    # A save whose rename found another save's checkpoint in place must not fail even if a third
    # save moves that one aside right after; the race is rare, so run many rounds.
    for round_ in range(30):
        target = tmp_path / f"model{round_}"
        errors = []

        def save(i, round_=round_, target=target, errors=errors):
            try:
                new = tmp_path / f"new{round_}-{i}"
                new.mkdir()
                (new / "config.json").write_text("{}")
                replace_directory(new, target)
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        threads = [threading.Thread(target=save, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, (round_, [repr(e) for e in errors])
        assert (target / "config.json").is_file()


def test_non_finite_values_name_their_stage():
    from replaceme_exp.errors import NonFiniteError, check_finite

    check_finite("eval", "x is", [1.0, 2])
    with pytest.raises(NonFiniteError, match=r"^stage selection: the candidate distances are not finite"):
        check_finite("selection", "the candidate distances are", [0.1, float("nan")])
    with pytest.raises(NonFiniteError):
        check_finite("eval", "x is", [None])


@pytest.mark.parametrize(
    "content, named",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00binary", "is not UTF-8 text"),
        (b"plain text\n\nwith a \x00 byte in it", "holds NUL bytes"),
    ],
)
def test_binary_calibration_text_is_refused(tmp_path, smollm2_tokenizer, content, named):
    from replaceme_exp.data.sources import text_file_documents
    from replaceme_exp.errors import ConfigError

    path = tmp_path / "calib.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"calibration.path='{path}': .*{named}"):
        text_file_documents(str(path), 1000)


@pytest.mark.parametrize(
    "lines, reason",
    [
        (['{"text": "fine"}', '{"text": "broken'], "line 2 is not valid JSON"),
        (['{"text": "fine"}', "[1, 2]"], "line 2 is not a JSON object"),
        (['{"messages": "a string, not turns"}'], "calibration.chat_field='messages': must hold a list of turns"),
        (['{"messages": [{"role": "wizard", "content": "hi"}]}'], "unknown role 'wizard'"),
    ],
)
def test_malformed_jsonl_names_the_file_line_or_field(tmp_path, smollm2_tokenizer, lines, reason):
    from helpers.config import typed

    from replaceme_exp.data import build_calibration
    from replaceme_exp.errors import ConfigError

    path = tmp_path / "calib.jsonl"
    path.write_text("\n".join(lines))
    cfg = typed(["calibration=jsonl", f"calibration.path={path}", "calibration.n_samples=1"]).calibration
    with pytest.raises(ConfigError, match=reason):
        build_calibration(cfg, smollm2_tokenizer)


def test_binary_jsonl_names_the_line(tmp_path, smollm2_tokenizer):
    from replaceme_exp.data.sources import check_jsonl
    from replaceme_exp.errors import ConfigError

    path = tmp_path / "calib.jsonl"
    path.write_bytes(b'{"text": "ok"}\n\xff\xfe\x00binary\n')
    with pytest.raises(ConfigError, match="line 2 is not UTF-8 text"):
        check_jsonl(path)


def test_an_unreachable_hub_model_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = ["model=llama3_8b_instruct", "model.pretrained=replaceme-tests/no-such-model", "model.dtype=float32"]
    row = run_recorded(job_config(tmp_path, *hub, "cuts=[[2,4]]"), raise_on_failure=False)
    assert row["status"] == "failed"
    named = "ConfigError: model.pretrained='replaceme-tests/no-such-model': cannot be loaded"
    assert row["error"].startswith(named)


GROUP_OPTIONS = [
    (group, path.stem)
    for group in ("model", "calibration", "selection", "objective", "regularizer", "structure", "eval", "experiment")
    for path in sorted((CONF / group).glob("*.yaml"))
]


@pytest.mark.parametrize("group, option", GROUP_OPTIONS)
def test_every_shipped_option_passes_validation_and_resolves(group, option):
    from helpers.config import ROOT, compose_config, config_hash, validate_config

    overrides = [f"{group}={option}"]
    if (group, option) in {("regularizer", r) for r in ("l1", "l1_to_identity", "l2_to_identity")}:
        overrides.append("objective=cosine")  # numerical objectives only (objective=ls refuses them)
    if (group, option) in {("structure", "rank1"), ("structure", "lower_triangular")}:
        overrides.append("objective=cosine")  # the official code's Adam-path structures (objective=ls refuses them)
    if (group, option) in {("selection", "shortgpt"), ("selection", "sleb"), ("selection", "laco")}:
        overrides.append("objective=identity")  # removals by search fit nothing (objective=ls refuses them)
    if (group, option) == ("objective", "linear_patch"):
        overrides.append("lt_placement=separate")  # the patch multiplies the whole block output (fused is refused)
    vision = {("model", "clip_vit_l14"), ("model", "tiny_clip"), ("eval", "clip"), ("eval", "clip_offline")}
    if (group, option) in vision or option in ("bundled_images", "image_folder", "hub_images"):
        overrides += [
            o for o in ("model=clip_vit_l14", "calibration=bundled_images", "eval=clip") if o.split("=")[0] != group
        ]
    if group == "calibration" and option in ("bundled_images", "image_folder", "hub_images"):
        overrides += {
            "image_folder": [f"calibration.path={ROOT}"],
            "hub_images": ["calibration.dataset=owner/images"],
        }.get(option, [])
    if group == "calibration" and option in ("text_file", "jsonl"):
        overrides.append(f"calibration.path={ROOT / 'README.md'}")
    if option == "jsonl":
        path = Path(__file__)  # any existing file: only validation runs here
        overrides[-1] = f"calibration.path={path}"
    cfg = compose_config(overrides)
    validate_config(cfg)
    assert config_hash(cfg)


def test_a_failed_rename_that_is_not_a_concurrent_save_is_raised_and_the_old_model_kept(tmp_path, monkeypatch):
    target, new = finished_and_new_model(tmp_path, "old", "new")
    real_rename = os.rename

    def denied(src, dst):
        if str(src) == str(new):
            raise PermissionError(13, "Permission denied")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", denied)
    with pytest.raises(PermissionError):
        replace_directory(new, target)
    assert (target / "config.json").read_text() == "old"


def test_a_sweep_counts_a_job_that_left_no_status_as_failed(tmp_path):
    from replaceme_exp.runtime.sweep_summary import read_statuses, summary_lines, write_job_status

    for i in range(3):
        (tmp_path / str(i) / ".hydra").mkdir(parents=True)
    write_job_status(tmp_path / "0", {"status": "finished", "cuts": [[2, 4]], "ppl_heldout": 3.0}, "alpha=1")
    write_job_status(tmp_path / "1", {"status": "skipped", "cuts": [[2, 4]]}, "alpha=2")
    (tmp_path / "2" / "replaceme_status.json").write_text('{"status": "fin')  # killed mid-write
    statuses = read_statuses(tmp_path)
    assert [s["status"] for s in statuses] == ["finished", "skipped", "failed"]
    assert summary_lines(statuses)[0] == "sweep: 1 finished, 1 skipped, 1 failed"


def test_calibration_accepts_json_arrays_lists_of_files_and_tool_roles(tmp_path, smollm2_tokenizer):
    from helpers.config import compose_config, validate_config

    from replaceme_exp.data import build_calibration

    array = tmp_path / "a.json"
    array.write_text('[{"text": "first record of an array"}, {"text": "second record"}]')
    lines = tmp_path / "b.jsonl"
    lines.write_text('{"text": "a record of a JSON lines file"}')
    cfg = compose_config(["calibration=jsonl", f"calibration.path=[{array},{lines}]", "calibration.n_samples=3"])
    validate_config(cfg)
    assert build_calibration(typed_config(cfg).calibration, smollm2_tokenizer).n_sequences == 3
    from replaceme_exp.data.sources import render_record

    turns = [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]
    assert "42" in render_record({"messages": turns}, None, "messages", smollm2_tokenizer)


def test_a_suite_without_a_metric_per_task_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a model was loaded for a bad configuration")

    monkeypatch.setattr(pipeline_job, "load_model", never)
    undeclared = job_config(tmp_path, "eval=offline", "~eval.harness.metrics.replaceme_doc_pairs")
    row = run_recorded(undeclared, raise_on_failure=False)
    assert row["status"] == "failed" and row["error"].startswith("ConfigError: eval.harness.metrics=")
