"""The results store and what a skip trusts (issue 23): the latest run of a configuration by a
sequence number, not by a node's clock; a finished model checked whole before it is skipped; what
killed runs left removed; folders that cannot be written found before the compute; the Makefile's
values never run as commands; report names that never leave the output folder."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.config import ROOT
from helpers.jobs import job_config
from omegaconf import OmegaConf

import replaceme_exp.results.row as row_module
import replaceme_exp.runtime.runner as runner
from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.rules import writable_directory
from replaceme_exp.reporting import paper_figures
from replaceme_exp.reporting.paths import MAX_LENGTH, file_name
from replaceme_exp.reporting.render_paper import render
from replaceme_exp.reporting.report import split_runs, write_report
from replaceme_exp.results import ResultsStore
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.callbacks import DirectoryCheck
from replaceme_exp.surgery import MANIFEST_FILE, checkpoint_problem, recipe_path, save_checkpoint, write_recipe


DEAD_PID = 2**22 + 1  # above Linux's largest pid_max: never a live process


def rows_of(store: ResultsStore, *rows: dict) -> ResultsStore:
    for row in rows:
        store.write({"config_hash": "h", "status": "finished", **row})
    return store


def test_a_rerun_whose_clock_is_behind_is_the_latest_run_everywhere(tmp_path):
    # run b is the forced rerun on a node whose clock is ten years behind
    store = rows_of(
        ResultsStore(tmp_path),
        {"run_id": "a", "run_seq": 1, "started_at": "2030-01-01T00:00:00+00:00"},
        {"run_id": "b", "run_seq": 2, "started_at": "2020-01-01T00:00:00+00:00"},
        {"run_id": "c", "run_seq": 3, "status": "failed", "started_at": "2040-01-01T00:00:00+00:00"},
    )
    assert store.finished_row("h")["run_id"] == "b"
    assert list(store.load(latest_per_config=True)["run_id"]) == ["b"]
    assert list(split_runs(store.load(), "all", "All").shown["run_id"]) == ["b"]


def test_rows_from_before_run_seq_are_older_than_any_with_it_and_ordered_by_start(tmp_path):
    store = rows_of(
        ResultsStore(tmp_path),
        {"run_id": "old1", "started_at": "2040-01-01"},
        {"run_id": "old2", "started_at": "2041-01-01"},
    )
    assert store.finished_row("h")["run_id"] == "old2"  # among themselves: started_at
    assert store.next_run_seq("h") == 1
    rows_of(store, {"run_id": "new", "run_seq": 1, "started_at": "2020-01-01"})
    assert store.finished_row("h")["run_id"] == "new"
    assert list(store.load(latest_per_config=True)["run_id"]) == ["new"]
    assert store.next_run_seq("h") == 2


def test_latest_per_config_keeps_one_row_per_configuration_finished_first(tmp_path):
    store = rows_of(
        ResultsStore(tmp_path),
        {"run_id": "a1", "config_hash": "a", "run_seq": 1, "started_at": "2030"},
        {"run_id": "a2", "config_hash": "a", "run_seq": 2, "status": "failed", "started_at": "2031"},
        {"run_id": "b1", "config_hash": "b", "run_seq": 1, "status": "failed", "started_at": "2020"},
        {"run_id": "b2", "config_hash": "b", "run_seq": 2, "status": "failed", "started_at": "2019"},
    )
    table = store.load(latest_per_config=True)
    assert list(table["run_id"]) == ["b2", "a1"]  # the latest failure of b; a's finished run


def test_each_run_takes_the_next_sequence_number_whatever_the_clock(tmp_path, monkeypatch):
    fake_job(monkeypatch)
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=false", "force=true")
    first = run_recorded(cfg)
    monkeypatch.setattr(row_module, "now", lambda: "2001-01-01T00:00:00+00:00")  # this node's clock is behind
    second = run_recorded(cfg)
    assert (first["run_seq"], second["run_seq"]) == (1, 2)
    store = ResultsStore(tmp_path)
    assert store.finished_row(first["config_hash"])["run_id"] == second["run_id"]


class FakeModel:
    """Writes what ``save_pretrained`` writes, small."""

    def save_pretrained(self, directory, **kwargs):
        Path(directory, "config.json").write_text('{"model_type": "llama"}')
        Path(directory, "model-00001-of-00002.safetensors").write_bytes(b"w" * 4096)
        Path(directory, "model-00002-of-00002.safetensors").write_bytes(b"v" * 2048)


class FakeTokenizer:
    def save_pretrained(self, directory, **kwargs):
        Path(directory, "tokenizer.json").write_text("{}")


def saved(path: Path) -> Path:
    return save_checkpoint(FakeModel(), FakeTokenizer(), path, {"run_id": "r"})


def test_a_saved_checkpoint_lists_its_files_and_sizes(tmp_path):
    target = saved(tmp_path / "model")
    files = json.loads((target / MANIFEST_FILE).read_text())["files"]
    assert files == {
        "config.json": len('{"model_type": "llama"}'),
        "model-00001-of-00002.safetensors": 4096,
        "model-00002-of-00002.safetensors": 2048,
        "replaceme.json": (target / "replaceme.json").stat().st_size,
        "tokenizer.json": 2,
    }
    assert checkpoint_problem(target) is None


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_checkpoint_with_a_missing_or_short_file_is_not_whole(tmp_path, damage):
    target = saved(tmp_path / "model")
    shard = target / "model-00002-of-00002.safetensors"
    if damage == "delete":
        shard.unlink()
        assert checkpoint_problem(target) == f"{shard} is missing"
    else:
        shard.write_bytes(b"v" * 100)
        assert checkpoint_problem(target) == f"{shard} has 100 of 2048 bytes"


def test_a_checkpoint_saved_before_the_manifest_needs_a_config_and_a_weight_file(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    assert checkpoint_problem(folder) == f"{folder / 'config.json'} is missing"
    (folder / "config.json").write_text("{}")
    assert "has no weight file" in checkpoint_problem(folder)
    (folder / "pytorch_model.bin").write_bytes(b"x")
    assert checkpoint_problem(folder) is None
    assert checkpoint_problem(tmp_path / "absent") == f"{tmp_path / 'absent'} is missing"
    broken = saved(tmp_path / "broken")
    (broken / MANIFEST_FILE).write_text("{not json")
    assert "is unreadable" in checkpoint_problem(broken)


def fake_job(monkeypatch, calls: list | None = None):
    """The runner's job replaced by one that saves a small fake checkpoint (when the job saves
    one) and finishes: the runner's skip, lock and row logic without a model."""

    def run_job(spec, paths, row, on_stage=None):
        if calls is not None:
            calls.append(row["run_id"])
        if spec.saves_model:
            target = paths.model_dir(row["config_hash"])
            saved(target)
            row["pruned_model_path"] = str(target)
        if spec.config.save_transforms or spec.model_save == "transform":
            target = paths.transforms_file(row["config_hash"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"T")
            row["transforms_path"] = str(target)
        if spec.model_save == "transform":
            write_recipe(paths.transforms_file(row["config_hash"]), {"config_hash": row["config_hash"]})
        row["status"] = "finished"
        return row

    monkeypatch.setattr(runner, "run_job", run_job)
    monkeypatch.setattr(runner, "weights_fingerprint", lambda model, cache_dir: {"fake": 1})


def test_a_finished_model_whose_weights_were_deleted_is_rebuilt_not_skipped(tmp_path, monkeypatch, caplog):
    calls = []
    fake_job(monkeypatch, calls)
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=full")
    first = run_recorded(cfg)
    assert run_recorded(cfg)["status"] == "skipped"
    shard = Path(first["pruned_model_path"]) / "model-00001-of-00002.safetensors"
    shard.unlink()  # the folder is kept
    with caplog.at_level("WARNING"):
        again = run_recorded(cfg)
    assert again["status"] == "finished" and len(calls) == 2
    assert f"{shard} is missing" in caplog.text and "running again" in caplog.text
    assert checkpoint_problem(first["pruned_model_path"]) is None
    assert run_recorded(cfg)["status"] == "skipped"


def test_a_finished_run_that_saved_its_transforms_is_skipped_only_while_they_are_whole(tmp_path, monkeypatch, caplog):
    """save_model=transform (the default): the skip checks the transforms file against the size
    its recipe recorded, and the recipe itself."""
    calls = []
    fake_job(monkeypatch, calls)
    cfg = job_config(tmp_path, "cuts=[[2,4]]")
    first = run_recorded(cfg)
    transforms = Path(first["transforms_path"])
    assert run_recorded(cfg)["status"] == "skipped" and len(calls) == 1
    transforms.write_bytes(b"")  # cut short
    with caplog.at_level("WARNING"):
        assert run_recorded(cfg)["status"] == "finished" and len(calls) == 2
    assert f"{transforms} has 0 of 1 bytes" in caplog.text and "running again" in caplog.text
    recipe_path(transforms).unlink()
    assert run_recorded(cfg)["status"] == "finished" and len(calls) == 3
    assert run_recorded(cfg)["status"] == "skipped"
    assert not (tmp_path / "models").exists()


def test_a_finished_run_whose_transforms_file_was_deleted_is_run_again(tmp_path, monkeypatch, caplog):
    calls = []
    fake_job(monkeypatch, calls)
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=false", "save_transforms=true")
    first = run_recorded(cfg)
    transforms = Path(first["transforms_path"])
    assert run_recorded(cfg)["status"] == "skipped"
    transforms.unlink()
    with caplog.at_level("WARNING"):
        assert run_recorded(cfg)["status"] == "finished" and len(calls) == 2
    assert f"its transforms file {transforms} is missing" in caplog.text


def test_temporary_row_files_of_dead_processes_are_removed_by_the_next_run(tmp_path, monkeypatch):
    fake_job(monkeypatch)
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=false")
    chash = run_recorded(cfg)["config_hash"]
    folder = tmp_path / "runs" / chash
    dead = folder / f".0123456789ab.parquet.{DEAD_PID}.tmp"
    live = folder / f".ba9876543210.parquet.{os.getppid()}.tmp"  # a live process's (not ours)
    dead.write_bytes(b"PAR1 half")
    live.write_bytes(b"PAR1 half")
    assert run_recorded(cfg)["status"] == "skipped"
    assert not dead.exists() and live.exists()
    assert len(list(folder.glob("*.parquet"))) == 1


@pytest.fixture
def read_only(monkeypatch):
    """Make folders read-only for this process, root included (root's access checks pass; the
    folder is also chmod-ed for a non-root run). Returns the function that does it."""
    denied: set[str] = set()
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if str(Path(path)) in denied and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)

    def make(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(stat.S_IRUSR | stat.S_IXUSR)
        denied.add(str(path))

    yield make
    for path in denied:
        Path(path).chmod(0o755)


@pytest.mark.parametrize("sub", ["runs", "models", "locks", "baselines"])
def test_a_read_only_folder_inside_the_results_is_refused_naming_it(tmp_path, read_only, sub):
    read_only(tmp_path / sub)
    with pytest.raises(ConfigError, match=f"results_dir=.*{tmp_path / sub} is not writable"):
        writable_directory("results_dir", str(tmp_path), ["runs", "locks", "baselines", "models"])
    writable_directory("results_dir", str(tmp_path), [s for s in ("runs", "locks", "baselines", "models") if s != sub])


@pytest.mark.parametrize("sub", ["runs", "models"])
def test_a_read_only_folder_of_the_configuration_is_found_before_the_compute(tmp_path, monkeypatch, read_only, sub):
    calls = []
    fake_job(monkeypatch, calls)
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "force=true", "save_model=full")
    folder = tmp_path / sub / run_recorded(cfg)["config_hash"]
    read_only(folder)
    row = run_recorded(cfg, raise_on_failure=False)
    assert row["status"] == "failed" and len(calls) == 1, row
    assert row["error"].startswith("ConfigError: results_dir=") and f"{folder} is not writable" in row["error"]


@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_a_read_only_hydra_folder_in_the_results_is_one_line_before_hydra_writes(tmp_path, read_only, mode, caplog):
    read_only(tmp_path / "hydra")
    folder = {"dir": f"{tmp_path}/hydra/{mode}s/2026"}
    config = OmegaConf.create({"results_dir": str(tmp_path), "cache_dir": str(tmp_path), "hydra": {mode: folder}})
    check = DirectoryCheck()
    with pytest.raises(SystemExit) as exit_, caplog.at_level("ERROR"):
        (check.on_run_start if mode == "run" else check.on_multirun_start)(config)
    assert exit_.value.code == 2
    assert f"hydra.{mode}.dir=" in caplog.text and f"{tmp_path / 'hydra'} is not writable" in caplog.text


def test_a_row_that_cannot_be_written_at_the_end_gives_a_failed_row_not_a_traceback(tmp_path, monkeypatch):
    fake_job(monkeypatch)

    def full_disk(self, row):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ResultsStore, "write", full_disk)
    cfg = job_config(tmp_path, "cuts=[[2,4]]", "save_model=false")
    row = run_recorded(cfg, raise_on_failure=False)
    assert row["status"] == "failed" and row["failed_stage"] == "save"
    assert row["error"].startswith("OSError: row not written under ") and "No space left" in row["error"]
    with pytest.raises(OSError, match="No space left"):  # a caller that asks for failures to raise
        run_recorded(cfg)


@pytest.mark.parametrize("name", ["tiny_llama", "2026-11-22_10-18-33", "smollm2_135m_pydoc_quick", "v1.2-x"])
def test_a_safe_name_is_kept_as_it_is(name):
    assert file_name(name) == name


@pytest.mark.parametrize(
    "name, start",
    [
        ("..", "unnamed_"),
        (".", "unnamed_"),
        ("../../..", "unnamed_"),
        ("", "unnamed_"),
        ("a/../../b", "a_b_"),
        ("evil_../../.._x", "evil___x_"),
        (".hidden", "hidden_"),
        ("_x", "x_"),
        ("meta-llama/Llama-3 8B", "meta-llama_Llama-3_8B_"),
        ("/etc/passwd", "etc_passwd_"),
        ("x" * 500, "x" * 50),
    ],
)
def test_any_other_name_becomes_one_safe_file_name(name, start):
    safe = file_name(name)
    assert safe.startswith(start) and len(safe) <= MAX_LENGTH
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", safe) and ".." not in safe


def test_names_made_safe_stay_distinct():
    names = ["..", ".", "../..", "", "a/b", "a b", "a_b_" + "x" * 300, "a_b_" + "x" * 301]
    assert len({file_name(n) for n in names}) == len(names)


def tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def undrawn(runs, png: Path, target=None) -> pd.DataFrame:
    """A figure's drawing stubbed (the figures' own tests draw them): an empty PNG, no points."""
    png.write_bytes(b"")
    points = pd.DataFrame()
    points.attrs["counts"] = f"{png.stem}: 0 runs found"
    return points


def test_row_values_never_make_the_reports_write_outside_their_folder(tmp_path, monkeypatch):
    figures = {name: dataclasses.replace(spec, draw=undrawn) for name, spec in paper_figures.FIGURES.items()}
    monkeypatch.setattr(paper_figures, "FIGURES", figures)
    results, out = tmp_path / "a" / "b" / "results", tmp_path / "a" / "b" / "results" / "out"
    store = ResultsStore(results)
    for i, sweep in enumerate(["..", "../../..", "../../../escaped"]):
        store.write(
            {
                "run_id": f"r{i}",
                "config_hash": f"h{i}",
                "run_seq": 1,
                "status": "finished",
                "sweep_id": sweep,
                "model": "../../../evil",
                "calibration": "../../..",
                "eval": "../../../x",
                "seed": i,
                "ppl_heldout": 10.0 + i,
            }
        )
    before = tree(tmp_path)
    written = render(results, out, model="../../../evil", echo=lambda line: None)
    write_report(results, out)
    assert written and all(out.resolve() in path.resolve().parents for path in written)
    new = tree(tmp_path) - before
    assert all(out.resolve() in p.resolve().parents for p in new), sorted(new)
    assert len(list((out / "sweeps").glob("*.md"))) == 3  # one page per sweep, none overwritten


# Logs its arguments; runs ``-c`` code as Python does (the Makefile's ARGS splitter), with this file
# as the interpreter it executes.
FAKE_PYTHON = """#!{python}
import json, os, sys
if sys.argv[1] == "-c":
    code, sys.argv = sys.argv[2], ["-c", *sys.argv[3:]]
    exec(code)
with open(os.environ["ARGV_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def outside_make() -> dict[str, str]:
    """The environment without what an enclosing ``make test ARGS=...`` passes to a make started under
    it (its command-line variables reach every sub-make through MAKEFLAGS)."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS")}


def make(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """``make -o setup -o setup-gemma3 <args>`` in the project with a fake interpreter (``PY``) that logs
    the arguments it gets: (the process, each logged argument list)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    log = tmp_path / "argv.jsonl"
    proc = subprocess.run(
        ["make", "-s", "-o", "setup", "-o", "setup-gemma3", f"PY={fake}", *args],
        cwd=tmp_path,
        env={**outside_make(), "ARGV_LOG": str(log), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    logged = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, logged


@pytest.fixture
def makefile_dir(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    return tmp_path


INJECTED = "x; touch PWNED_SHELL $(touch PWNED_SUBSHELL) `touch PWNED_BACKTICK`"


def test_make_passes_values_as_arguments_never_as_commands(makefile_dir):
    values = {
        "MODEL": INJECTED,
        "CALIBRATION": "$(shell touch PWNED_MAKE)",
        "EVAL": "-x --out=/tmp",
        "PROTOCOL": "paper",
        "RESULTS": "res; touch PWNED_RESULTS",
    }
    proc, logged = make(makefile_dir, "paper-tables", *(f"{k}={v}" for k, v in values.items()))
    assert proc.returncode == 0, proc.stderr
    assert not list(makefile_dir.glob("PWNED*"))
    assert logged == [
        [
            "-m",
            "replaceme_exp.reporting.render_paper",
            f"--results={values['RESULTS']}",
            f"--out={values['RESULTS']}/paper_tables",
            f"--model={INJECTED}",
            "--calibration=$(shell touch PWNED_MAKE)",
            "--eval=-x --out=/tmp",
            "--protocol=paper",
        ]
    ]


@pytest.mark.parametrize("target", ["run", "test", "test-fast", "bench", "report"])
def test_make_splits_args_like_a_shell_and_runs_none_of_them(makefile_dir, target):
    args = f"objective=identity 'cuts=[[2, 4]]' {INJECTED} *"
    proc, logged = make(makefile_dir, target, f"ARGS={args}", "TEST_WORKERS=2; touch PWNED_WORKERS")
    assert proc.returncode == 0, proc.stderr
    assert not list(makefile_dir.glob("PWNED*"))
    (argv,) = logged
    if target != "report":  # report takes no ARGS
        split = ["objective=identity", "cuts=[[2, 4]]", "x;", "touch", "PWNED_SHELL", "$(touch", "PWNED_SUBSHELL)"]
        assert argv[-len(split) - 3 :] == [*split, "`touch", "PWNED_BACKTICK`", "*"]
    if target in ("test", "test-fast"):
        assert argv[argv.index("-n") + 1] == "2; touch PWNED_WORKERS"


@pytest.mark.parametrize(
    "target, variable, expected",
    [
        ("export", "RUN", ["-m", "replaceme_exp.runtime.export", INJECTED, "--results-dir=results"]),
        (
            "wandb-dashboard",
            "SWEEP",
            ["-m", "replaceme_exp.reporting.wandb_dashboard", "--results=results", f"--sweep={INJECTED}"],
        ),
        ("dashboard", "RESULTS", ["-m", "replaceme_exp.reporting.dashboard", f"--results={INJECTED}"]),
        ("report", "SHOW_FAILED", ["-m", "replaceme_exp.reporting.report", "--results=results", "--show-failed"]),
        ("clean-failed", "CONFIRM", ["-m", "replaceme_exp.results.cleaning", "--results=results", "--confirm"]),
    ],
)
def test_make_targets_of_this_issue_pass_values_as_arguments(makefile_dir, target, variable, expected):
    value = "$(shell touch PWNED_MAKE)" if variable in ("CONFIRM", "SHOW_FAILED") else INJECTED
    proc, logged = make(makefile_dir, target, f"{variable}={value}")
    assert proc.returncode == 0, proc.stderr
    assert not list(makefile_dir.glob("PWNED*"))
    assert logged == [expected]


def test_make_defaults_reach_the_recipes(makefile_dir):
    """PYTHON (what creates the venv on a fresh machine) and TEST_WORKERS keep their defaults
    when not given: exporting an undefined variable must not leave them empty."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "TEST_WORKERS")}
    show = ["make", "-s", "--eval", 'show: ; @echo "[$$PYTHON][$$TEST_WORKERS]"', "show"]
    proc = subprocess.run(show, cwd=makefile_dir, env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[python3][2]", proc.stderr
    given = subprocess.run([*show, "PYTHON=python3.11"], cwd=makefile_dir, env=env, capture_output=True, text=True)
    assert given.stdout.strip() == "[python3.11][2]"


def aged(path: Path, minutes: float = 60) -> Path:
    then = time.time() - minutes * 60
    os.utime(path, (then, then))
    return path


def test_make_clean_cache_cleans_the_configured_cache_and_what_killed_jobs_left(makefile_dir):
    cache, results, tmpdir = makefile_dir / "shared cache", makefile_dir / "res", makefile_dir / "tmp"
    default_cache = makefile_dir / ".cache" / "stats"
    for folder in (cache / "stats", cache / "fingerprints", cache / "smollm2-135m-instruct", default_cache):
        folder.mkdir(parents=True)
        (folder / "entry").write_text("x")
    stale, converting = cache / ".convert-killed", cache / ".convert-running"
    for folder in (stale, converting):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"w")
    aged(stale)
    (results / "runs" / "h").mkdir(parents=True)
    kept_row = results / "runs" / "h" / "r.parquet"
    kept_row.write_bytes(b"PAR1")
    stale_row = results / "runs" / "h" / ".r2.parquet.123.tmp"
    stale_row.write_bytes(b"PAR1")
    aged(stale_row)
    writing_row = results / "runs" / "h" / ".r3.parquet.456.tmp"
    writing_row.write_bytes(b"PAR1")
    (cache / "smollm2-135m-instruct" / ".config.json.789.tmp").write_text("{")
    aged(cache / "smollm2-135m-instruct" / ".config.json.789.tmp")
    (results / "models" / ".save-h-killed").mkdir(parents=True)
    tmpdir.mkdir()
    (tmpdir / "token-store-x").mkdir()
    proc, _ = make(makefile_dir, "clean-cache", REPLACEME_CACHE=str(cache), RESULTS=str(results), TMPDIR=str(tmpdir))
    assert proc.returncode == 0, proc.stderr
    gone = [cache / "stats", cache / "fingerprints", stale, stale_row, results / "models" / ".save-h-killed"]
    gone += [cache / "smollm2-135m-instruct" / ".config.json.789.tmp", tmpdir / "token-store-x"]
    assert not [p for p in gone if p.exists()]
    kept = [converting, writing_row, kept_row, cache / "smollm2-135m-instruct" / "entry", default_cache / "entry"]
    assert all(p.exists() for p in kept), [p for p in kept if not p.exists()]
