"""LLM-Streamline (objective=streamline_ffn / streamline_layer, experiment=llm_streamline /
llm_streamline_layer): the cut's hidden states as the model computes them, the block run alone as
inside the model, the official learning-rate schedule, training that lowers the loss, and the pruned
models: the FFN variant equals a hand-built model with the FFN written out, the layer variant is a
plain checkpoint with the trained block, and the export builds what save_model=full saves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.jobs import job_config
from safetensors.torch import load_file

from replaceme_exp.models import adapter_for, load_model
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.runtime import run_recorded
from replaceme_exp.runtime.export import export_checkpoint
from replaceme_exp.surgery import REPLACEMENT_NETWORKS_FILE, SEPARATE_TRANSFORMS_FILE, load_pruned


TRAINED = ["objective.epochs=4", "objective.batch_size=4", "objective.grad_accumulation=1"]  # steps on 24 sequences


def tiny_model_from(tmp_path):
    """The jobs' tiny_llama (random weights from its seed), built as a job builds it."""
    c = JobSpec.from_config(job_config(tmp_path / "reference")).config
    return load_model(c.model, Path(c.cache_dir), None).model


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(path.glob("model*.safetensors")) for k, v in load_file(f).items()}


class BlockThenFFN(torch.nn.Module):
    """A block followed by an FFN written out by hand: ``relu(h W1^T + b1) W2^T + b2``."""

    def __init__(self, block, tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.block, self.t = block, tensors

    def forward(self, *args, **kwargs):
        out = self.block(*args, **kwargs)
        h = out[0] if isinstance(out, tuple) else out
        t = self.t
        h = torch.relu(h @ t["fc1.weight"].T + t["fc1.bias"]) @ t["fc2.weight"].T + t["fc2.bias"]
        return (h, *out[1:]) if isinstance(out, tuple) else h


@pytest.mark.slow
def test_the_ffn_variant_equals_a_hand_built_model_with_its_ffn_and_exports_the_same(tmp_path):
    overrides = ["experiment=llm_streamline", "eval.samples=null", *TRAINED]
    light = run_recorded(job_config(tmp_path / "light", *overrides))
    full = run_recorded(job_config(tmp_path / "full", *overrides, "save_model=full"))
    assert light["status"] == full["status"] == "finished", (light.get("error"), full.get("error"))
    assert light["method"] == "LLM-Streamline (FFN)" and light["plain_checkpoint"] is False
    start, end = light["replaced_cut"]
    assert light["cuts"] == [[start, end]] and light["n_prune"] == 2 == end - start
    assert light["replacement_loss_after"] < light["replacement_loss_before"]
    assert light["replacement_steps"] == 4 * 6 and light["time_estimate_s"] > 0
    hidden = 64
    assert light["replacement_params_added"] == 2 * 4 * hidden * hidden + 5 * hidden
    base = adapter_for(tiny_model_from(tmp_path))
    removed = sum(p.numel() for i in range(start, end) for p in base.layers[i].parameters())
    assert light["params_after"] == light["params_before"] - removed + light["replacement_params_added"]

    saved = Path(full["pruned_model_path"])
    assert (saved / REPLACEMENT_NETWORKS_FILE).is_file()
    ffn = {k.split(".", 2)[2]: v for k, v in load_file(saved / REPLACEMENT_NETWORKS_FILE).items()}
    assert {k.split(".")[1] for k in load_file(saved / REPLACEMENT_NETWORKS_FILE)} == {str(start - 1)}

    # by hand: the base model, the cut's blocks removed, the FFN written out after block start - 1
    model = base.model
    adapter = adapter_for(model)
    adapter.keep_layers([i for i in range(6) if not start <= i < end])
    adapter.layers[start - 1] = BlockThenFFN(adapter.layers[start - 1], ffn)
    ids = torch.randint(0, 1000, (2, 16))
    with torch.no_grad():
        mine = model(ids).logits
        theirs = load_pruned(saved).eval()(ids).logits
    torch.testing.assert_close(theirs, mine, rtol=1e-4, atol=1e-4)
    assert light["ppl_heldout"] == pytest.approx(full["ppl_heldout"], rel=1e-6)
    evaluated = run_recorded(job_config(tmp_path / "eval", "job=evaluate", f"evaluate.checkpoint={saved}"))
    assert evaluated["status"] == "finished" and evaluated["plain_checkpoint"] is False  # the FFN re-attached
    assert evaluated["params"] == full["params_after"]
    assert evaluated["ppl_heldout"] == pytest.approx(full["ppl_heldout"], rel=1e-5)

    exported = export_checkpoint(tmp_path / "light", light["config_hash"])
    assert checkpoint_tensors(exported).keys() == checkpoint_tensors(saved).keys()
    assert all(torch.equal(checkpoint_tensors(exported)[k], v) for k, v in checkpoint_tensors(saved).items())
    again = load_file(exported / REPLACEMENT_NETWORKS_FILE)
    assert all(torch.equal(again[k], v) for k, v in load_file(saved / REPLACEMENT_NETWORKS_FILE).items())


@pytest.mark.slow
def test_the_layer_variant_is_a_plain_checkpoint_with_the_trained_block_and_exports_the_same(tmp_path):
    from transformers import AutoModelForCausalLM

    overrides = ["experiment=llm_streamline_layer", "eval.samples=null", *TRAINED]
    light = run_recorded(job_config(tmp_path / "light", *overrides))
    full = run_recorded(job_config(tmp_path / "full", *overrides, "save_model=full"))
    assert light["status"] == full["status"] == "finished", (light.get("error"), full.get("error"))
    assert light["method"] == "LLM-Streamline (layer)" and light["plain_checkpoint"] is True
    start, end = light["replaced_cut"]
    assert end - start == 3 and light["cuts"] == [[start + 1, end]] and light["n_prune"] == 2
    assert light["kept_blocks"] == [i for i in range(6) if not start < i < end]
    assert light["replacement_loss_after"] < light["replacement_loss_before"]
    assert light["replacement_params_added"] == 0

    saved = Path(full["pruned_model_path"])
    assert not (saved / REPLACEMENT_NETWORKS_FILE).exists() and not (saved / SEPARATE_TRANSFORMS_FILE).exists()
    plain = AutoModelForCausalLM.from_pretrained(saved).eval()  # no re-attachment needed
    trained = {k.split(".", 2)[2]: v for k, v in load_file(light["transforms_path"]).items() if k.startswith("block.")}
    assert {k.split(".")[1] for k in load_file(light["transforms_path"])} == {str(start)}
    base = adapter_for(tiny_model_from(tmp_path))
    removed = sum(p.numel() for i in range(start + 1, end) for p in base.layers[i].parameters())
    assert light["params_after"] == light["params_before"] - removed
    block = dict(adapter_for(plain).layers[start].named_parameters())
    original = dict(base.layers[start].named_parameters())
    assert trained.keys() == block.keys()
    for name, value in trained.items():
        torch.testing.assert_close(block[name], value, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(block[n], original[n]) for n in block)  # training moved the block
    kept_after = [i for i in range(end, 6)]  # the blocks after the cut, untouched, follow the trained one
    for offset, index in enumerate(kept_after, start=start + 1):
        later = dict(adapter_for(plain).layers[offset].named_parameters())
        assert all(torch.equal(later[n], v) for n, v in base.layers[index].named_parameters())

    exported = export_checkpoint(tmp_path / "light", light["config_hash"])
    assert checkpoint_tensors(exported).keys() == checkpoint_tensors(saved).keys()
    assert all(torch.equal(checkpoint_tensors(exported)[k], v) for k, v in checkpoint_tensors(saved).items())
