"""The protocol axis (the config group ``protocol=paper|official``, conf/protocol/, and the rules of
config/protocol.py) and the official code's
settings it sets: padded positions in the statistics, a float32 capture copy, batches in the order
read with an incomplete last one dropped, touching cuts composed into one down-projection, and
sequential transforms for numerical objectives. Each is checked against an independent
computation: the official code's own arithmetic over a plain ``model(...)`` forward, or a
hand-written forward pass (tests/helpers/explicit.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers.batches import batches_of, random_sequences
from helpers.config import CACHE, compose_config, typed
from helpers.models import tiny_model
from helpers.protocol import _without_gpu_checks
from helpers.tables import SPECS, frame, run

from replaceme_exp.capture import LinearStatistics, run_capture
from replaceme_exp.capture.token_rules import TokenRule
from replaceme_exp.data.batching import with_counted_positions
from replaceme_exp.data.calibration import build_calibration
from replaceme_exp.errors import ConfigError
from replaceme_exp.models import adapter_for
from replaceme_exp.models.loading import load_model
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.reporting.paper_settings import Target
from replaceme_exp.reporting.paper_tables import build_table
from replaceme_exp.selection.cuts import composed_cuts, fusion_blocks, select_cuts, validate_cuts


@pytest.mark.slow
def test_protocol_official_sets_what_the_official_code_ran_and_keeps_explicit_choices():
    paper = JobSpec.from_config(compose_config(["experiment=replaceme_cosine", "calibration=slimorca", "num_lts=2"]))
    spec = JobSpec.from_config(
        compose_config(["experiment=replaceme_cosine", "calibration=slimorca", "num_lts=2", "protocol=official"])
    )
    c, p = spec.config, paper.config
    assert (p.selection.metric, p.selection.tokens, p.calibration.order, p.calibration.chat_turns) == (
        "cosine",
        "all",
        "shuffled",
        "all",
    )
    assert (c.selection.metric, c.selection.tokens) == ("angular", "last")
    assert (c.calibration.order, c.calibration.chat_turns) == ("first", "first_pair")
    assert (c.calibration.batch_order, c.calibration.drop_last) == ("as_read", True)
    assert c.estimation.padded_positions is True and p.estimation.padded_positions is False
    assert (c.model.capture_dtype, c.model.dtype) == ("float32", "bfloat16")
    assert (c.objective.schedule, c.multi_lt, c.touching_cuts) == ("minibatch", "sequential", "compose")
    assert spec.config_hash != paper.config_hash
    columns = spec.setting_columns()
    assert columns["protocol"] == "official" and columns["selection_metric"] == "angular_last"
    assert (columns["capture_dtype"], columns["dtype"], columns["padded_positions"]) == ("float32", "bfloat16", True)
    # the LS pipeline estimates every T from the unpruned model: independent
    ls = JobSpec.from_config(compose_config(["experiment=replaceme_ls", "num_lts=2", "protocol=official"]))
    assert ls.config.multi_lt == "independent"
    # a setting that is not the paper's stays as chosen; a token rule keeps padded positions out
    cka = JobSpec.from_config(compose_config(["protocol=official", "selection=cka"]))
    assert cka.config.selection.metric == "cka" and cka.config.estimation.padded_positions is True
    sinks = JobSpec.from_config(compose_config(["protocol=official", "selection=cka", "estimation=rescale_massive"]))
    assert sinks.config.estimation.padded_positions is False
    # the line-search solvers run in float32 as torchmin did there; Adam always does, and the key does not
    # move its hash
    lbfgs = ["objective=cosine", "objective.solver=lbfgs"]
    official = JobSpec.from_config(compose_config([*lbfgs, "protocol=official"]))
    assert official.config.objective.precision == "float32"
    assert official.setting_columns()["solver_precision"] == "float32"
    assert JobSpec.from_config(compose_config(lbfgs)).setting_columns()["solver_precision"] == "float64"
    adam = JobSpec.from_config(compose_config(["objective=cosine"]))
    adam32 = JobSpec.from_config(compose_config(["objective=cosine", "objective.precision=float32"]))
    assert adam.config_hash == adam32.config_hash and adam.setting_columns()["solver_precision"] == "float32"
    assert spec.setting_columns()["solver_precision"] == "float32"
    # protocol=paper is this project's configuration, unchanged (and its hash)
    default = JobSpec.from_config(compose_config([]))
    paper_default = JobSpec.from_config(compose_config(["protocol=paper"]))
    assert (paper_default.config, paper_default.config_hash) == (default.config, default.config_hash)


@pytest.mark.slow
def test_cfg_job_prints_what_protocol_official_runs():
    """``--cfg job`` shows the protocol's fixed values; what it leaves to rules shows as null / auto
    and is settled before the job starts (the rest of this module checks to what)."""
    import subprocess
    import sys

    import yaml
    from helpers.config import ROOT

    out = subprocess.run(
        [sys.executable, "run.py", "experiment=replaceme_official", "--cfg", "job"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    printed = yaml.safe_load(out)
    assert printed["protocol"] == "official"
    assert (printed["selection"]["metric"], printed["selection"]["tokens"]) == ("angular", "last")
    assert (printed["touching_cuts"], printed["solver_schedule"], printed["model"]["dtype"]) == (
        "compose",
        "minibatch",
        "bfloat16",
    )
    assert (printed["calibration"]["order"], printed["calibration"]["chat_turns"]) == (None, None)
    assert printed["model"]["capture_dtype"] == "auto" and printed["estimation"]["padded_positions"] is None
    spec = JobSpec.from_config(compose_config(["experiment=replaceme_official"]))
    assert (spec.config.model.capture_dtype, spec.config.estimation.padded_positions) == ("float32", True)
    assert (spec.config.calibration.order, spec.config.calibration.chat_turns) == ("first", "first_pair")
    assert (spec.config.calibration.batch_order, spec.config.calibration.drop_last) == ("as_read", True)


@pytest.mark.slow
def test_a_bare_protocol_official_fits_and_evaluates_as_the_official_code():
    """Hand-typed, ``protocol=official`` fits on every token (no sink rows clipped, the project's
    default) and evaluates with the official lm-eval suite (not ``eval=quick``); typed choices and a
    preset's own win, and ``--cfg job`` shows what runs (issue 50)."""
    import subprocess
    import sys

    import yaml
    from helpers.config import ROOT

    bare, default = typed(["protocol=official"]), typed([])
    assert (default.estimation.tokens, default.eval.name) == ("rescale_massive", "quick")
    assert (bare.estimation.tokens, bare.eval.name) == ("all", "paper")
    kept = typed(["protocol=official", "estimation=rescale_massive", "eval=quick"])
    assert (kept.estimation.tokens, kept.eval.name) == ("rescale_massive", "quick")
    assert typed(["protocol=official", "experiment=replaceme_recipe"]).estimation.tokens == "rescale_massive"
    out = subprocess.run(
        [sys.executable, "run.py", "protocol=official", "--cfg", "job"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    printed = yaml.safe_load(out)
    assert (printed["estimation"]["tokens"], printed["eval"]["name"]) == ("all", "paper")


def test_a_choice_typed_under_protocol_official_wins_even_when_it_is_the_papers():
    typed = [
        "selection=cosine",
        "model.dtype=float32",
        "calibration=slimorca",
        "calibration.order=shuffled",
        "calibration.chat_turns=all",
        "calibration.batch_order=by_length",
        "calibration.drop_last=false",
        "calibration.empty_records=drop",
        "objective=cosine",
        "num_lts=2",
        "multi_lt=independent",
        "touching_cuts=apart",
        "solver_schedule=full_batch",
        "objective.solver=lbfgs",
        "objective.precision=float64",
        "objective.solver_backend=scipy_torch",
        "objective.mse_reduction=sum_hidden",
        "estimation=all",
        "estimation.padded_positions=false",
        "model.capture_dtype=null",
        "eval=quick",
        "eval.harness.batch_size=8",
        "capture.last_state=block_output",
    ]
    chosen = JobSpec.from_config(compose_config(["protocol=official", *typed]))
    paper = JobSpec.from_config(compose_config(["protocol=paper", *typed]))
    c = chosen.config
    assert (c.selection.metric, c.selection.tokens, c.model.dtype, c.model.capture_dtype) == (
        "cosine",
        "all",
        "float32",
        None,
    )
    assert (c.calibration.order, c.calibration.chat_turns, c.calibration.batch_order, c.calibration.drop_last) == (
        "shuffled",
        "all",
        "by_length",
        False,
    )
    assert (c.multi_lt, c.touching_cuts, c.objective.schedule, c.objective.precision) == (
        "independent",
        "apart",
        "full_batch",
        "float64",
    )
    assert c.estimation.padded_positions is False
    # every setting is the paper's: only the label (and so the hash) differs
    assert dataclasses.replace(c, protocol="paper") == paper.config


@pytest.mark.parametrize(
    "preset", ["llm_streamline", "llm_streamline_layer", "shortgpt", "sleb", "laco", "linearpatch"]
)
def test_a_peer_preset_keeps_its_own_settings_under_protocol_official(preset):
    """The protocol sets ReplaceMe's and UIDL's settings; a peer's preset keeps its selection and its
    fit (the harness's data, dtype and capture copy are the protocol's for every method)."""
    paper = JobSpec.from_config(compose_config([f"experiment={preset}"]))
    official = JobSpec.from_config(compose_config([f"experiment={preset}", "protocol=official"]))
    assert official.config.selection == paper.config.selection
    assert official.setting_columns()["padded_positions"] is False
    assert official.config.multi_lt == paper.config.multi_lt == "independent"
    assert official.config.model.dtype == "bfloat16" and official.config.model.capture_dtype == "float32"


def test_masking_runs_under_protocol_official_with_padded_positions_off():
    for overrides in (["+paper=masking", "mask_ratio=0.25"], ["objective=cosine", "estimation=all", "mask_ratio=0.25"]):
        spec = JobSpec.from_config(compose_config([*overrides, "protocol=official"]))
        assert spec.config.estimation.padded_positions is False
        assert spec.setting_columns()["padded_positions"] is False and spec.setting_columns()["mask_ratio"] == 0.25
    unmasked = JobSpec.from_config(compose_config(["objective=cosine", "estimation=all", "protocol=official"]))
    assert unmasked.setting_columns()["padded_positions"] is True


def test_capture_4bit_under_protocol_official_is_refused_only_for_what_this_machine_lacks(monkeypatch):
    """The 4-bit copy is the capture's: the protocol's float32 copy gives way to it. Without a GPU and
    bitsandbytes the job is refused for them alone, in one line."""
    from replaceme_exp.models import loading

    overrides = ["experiment=replaceme_official", "model=llama32_1b_instruct", "model.capture_4bit=true"]
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(overrides))
    assert str(err.value).startswith("model.capture_4bit=True: needs the bitsandbytes package") or (
        "CUDA GPU" in str(err.value)
    )
    monkeypatch.setattr(loading, "check_nf4_capture", lambda cfg: None)
    import replaceme_exp.pipeline.rules as rules

    monkeypatch.setattr(rules, "check_nf4_capture", lambda cfg: None)
    spec = JobSpec.from_config(compose_config(overrides))
    assert spec.config.model.capture_4bit is True and spec.config.model.capture_dtype is None
    assert spec.setting_columns()["capture_4bit"] is True


def test_a_vision_job_under_protocol_official_is_refused_in_one_line():
    overrides = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", "protocol=official"]
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(overrides))
    assert str(err.value).startswith("protocol='official': the official code has no CLIP path") and "\n" not in str(
        err.value
    )
    assert JobSpec.from_config(compose_config(overrides[:-1])).config.protocol == "paper"


def test_the_parts_of_a_mix_take_the_official_record_order():
    spec = JobSpec.from_config(compose_config(["calibration=slimorca_fineweb", "protocol=official"]))
    assert {p["order"] for p in spec.config.calibration.parts.values()} == {"first"}


def test_the_official_presets_are_protocol_official_and_their_rows_can_fill_the_official_tables():
    for preset in ("replaceme_official", "replaceme_official_cosine", "uidl_official"):
        columns = JobSpec.from_config(compose_config([f"experiment={preset}"])).setting_columns()
        assert (columns["protocol"], columns["calibration"], columns["selection_metric"]) == (
            "official",
            "slimorca",
            "angular_last",
        )
        assert (columns["calibration_order"], columns["calibration_chat_turns"], columns["n_prune"]) == (
            "first",
            "first_pair",
            8,
        )


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["estimation=rescale_massive", "estimation.padded_positions=true"], "estimation.padded_positions"),
        (
            ["estimation=all", "estimation.padded_positions=true", "calibration.padding_side=left"],
            "estimation.padded_positions",
        ),
        (["estimation=all", "estimation.padded_positions=true", "mask_ratio=0.2"], "estimation.padded_positions"),
        (["model.capture_dtype=float32", "model.capture_4bit=true"], "model.capture_dtype"),
        (["num_lts=2", "merge_consecutive=false", "touching_cuts=compose", "healing=lt_only"], "touching_cuts"),
    ],
)
def test_official_settings_that_cannot_act_are_refused_in_one_line(overrides, key):
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(overrides))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


def test_padded_positions_give_the_official_statistics_of_a_padded_batch():
    """The official lstsq.py: ``model(**inputs)`` of a right-padded batch (no position ids), then
    ``view(-1, hidden)`` of the MLP output and hidden states, padded positions included."""
    model = tiny_model(num_layers=6)
    batches = batches_of(random_sequences(5, 4, 12, seed=3), batch_size=3)  # padded: lengths differ
    cut, hidden = (2, 4), model.config.hidden_size
    rule = TokenRule("all", padded_positions=True)
    padded = LinearStatistics([cut], hidden, torch.device("cpu"), "fused", rule)
    plain = LinearStatistics([cut], hidden, torch.device("cpu"), "fused", TokenRule("all"))
    run_capture(adapter_for(model), with_counted_positions(batches), [padded, plain])
    got = padded.result()[cut]

    mtm = torch.zeros(hidden, hidden, dtype=torch.float64)
    mtr = torch.zeros(hidden, hidden, dtype=torch.float64)
    mlp = {}
    hook = model.model.layers[cut[0] - 1].mlp.register_forward_hook(lambda m, a, out: mlp.update(out=out))
    with torch.no_grad():
        for batch in batches:
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
            states = out.hidden_states[1:]
            a1 = mlp["out"].reshape(-1, hidden).double()
            a2 = (states[cut[1] - 1] + mlp["out"] - states[cut[0] - 1]).reshape(-1, hidden).double()
            mtm += a1.T @ a1
            mtr += a1.T @ a2
    hook.remove()
    positions = sum(b.attention_mask.numel() for b in batches)
    assert got.n_tokens == positions > batches.n_tokens
    torch.testing.assert_close(got.mtm, mtm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.mtr, mtr, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(plain.result()[cut].mtm, mtm, rtol=1e-3)  # masked statistics differ


def test_batches_in_the_order_read_with_the_incomplete_last_one_dropped():
    tokenizer = load_model(typed(["model=tiny_llama"]).model, CACHE).tokenizer
    base = ["calibration=pydoc", "calibration.n_samples=10", "calibration.batch_size=4", "calibration.seq_len=32"]
    by_length = build_calibration(typed(base).calibration, tokenizer)
    in_order = ["calibration.batch_order=as_read", "calibration.drop_last=true"]
    official = build_calibration(typed(base + in_order).calibration, tokenizer)
    assert [b.input_ids.shape[0] for b in by_length] == [4, 4, 2]
    assert [b.input_ids.shape[0] for b in official] == [4, 4]

    def rows(batches):
        return [tuple(ids[mask.bool()].tolist()) for b in batches for ids, mask in zip(b.input_ids, b.attention_mask)]

    read = rows(build_calibration(typed(base + ["calibration.batch_order=as_read"]).calibration, tokenizer))
    assert rows(official) == read[:8]  # the documents as drawn, in order
    assert sorted(rows(by_length), key=len, reverse=True) == rows(by_length) != read


def test_unmerged_cuts_may_touch_when_composed():
    distances = {(1, 3): 0.1, (3, 5): 0.2, (5, 7): 0.3, (2, 4): 0.9, (4, 6): 0.9}
    assert select_cuts(distances, 2, merge_consecutive=False) == [(1, 3), (5, 7)]
    assert select_cuts(distances, 2, merge_consecutive=False, touching="compose") == [(1, 3), (3, 5)]
    assert select_cuts(distances, 2, merge_consecutive=True, touching="compose") == [(1, 5)]
    with pytest.raises(ConfigError, match="touch"):
        validate_cuts([[1, 3], [3, 5]], 8, merge_consecutive=False)
    cuts = validate_cuts([[1, 3], [3, 5], [6, 7]], 8, merge_consecutive=False, touching="compose")
    assert composed_cuts(cuts) == {(3, 5)}
    assert fusion_blocks(cuts) == {(1, 3): 0, (3, 5): 0, (6, 7): 5}


def test_the_tables_render_each_protocol_from_its_own_runs():
    paper_run = run(1, objective="ls", avg_acc=0.60)
    official_run = run(2, objective="ls", avg_acc=0.62, protocol="official", selection_metric="angular_last")
    runs = frame(paper_run, official_run)
    spec = SPECS["llama3_main"]

    def ls_cell(table):
        chosen = table[(table["Setting"] == "ReplaceMe") & (table["Linear transform"] == "Linear (LS)")]
        return chosen.iloc[0]["Avg-acc"]

    paper = build_table(spec, runs)
    official = build_table(spec, runs, target=Target(protocol="official"))
    assert (str(ls_cell(paper)), str(ls_cell(official))) == ("0.6", "0.62")
    assert "protocol=official" in official.attrs["retargeted"] and paper.attrs["retargeted"] is None


def test_every_setting_left_to_the_protocol_has_one_rule_and_its_schema_default_leaves_it():
    from replaceme_exp.config import protocol

    ruled = [k for rule in protocol.RULES for k in rule.keys]
    assert len(ruled) == len(set(ruled))
    assert set(protocol.LEFT_TO_PROTOCOL) <= set(ruled)
    composed = compose_config(["calibration=slimorca", "objective=cosine"])
    from omegaconf import OmegaConf

    for key, sentinel in protocol.LEFT_TO_PROTOCOL.items():
        assert OmegaConf.select(composed, key) == sentinel, key
    with pytest.raises(LookupError, match="no protocol rule settled"):
        saved = list(protocol.RULES)
        try:
            protocol.RULES.clear()
            typed(["calibration=slimorca"])
        finally:
            protocol.RULES[:] = saved


def _official_states(model, batches) -> list[tuple]:
    """Per batch: ``model(..., output_hidden_states=True).hidden_states[1:]`` (the last after the
    final norm), the MLP outputs by block and the attention mask, as the official code reads them."""
    mlp: dict[int, torch.Tensor] = {}
    hooks = [
        layer.mlp.register_forward_hook(lambda m, a, out, i=i: mlp.__setitem__(i, out))
        for i, layer in enumerate(model.model.layers)
    ]
    out = []
    with torch.no_grad():
        for batch in batches:
            states = model(batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
            out.append((states.hidden_states[1:], dict(mlp), batch.attention_mask.bool()))
    for hook in hooks:
        hook.remove()
    return out


def _captured(model, batches, cuts, last_state: str, mode: str = "whole"):
    """Our angular distance at each sequence's last token (protocol=official's selection), cosine
    distance over all tokens, and LS transform (fused) of every cut, captured under ``last_state``."""
    from replaceme_exp.capture import CutDistances
    from replaceme_exp.capture.execution import CaptureExecution
    from replaceme_exp.estimation.least_squares import ridge_solve
    from replaceme_exp.selection.metrics import angular_distance

    hidden = model.config.hidden_size
    angular = CutDistances(cuts, angular_distance, tokens="last")
    cosine = CutDistances(cuts)
    stats = LinearStatistics(cuts, hidden, torch.device("cpu"), "fused")
    execution = CaptureExecution(mode=mode, last_state=last_state)
    run_capture(adapter_for(model), batches, [angular, cosine, stats], execution=execution)
    transforms = {cut: ridge_solve(s) for cut, s in stats.result().items()}
    return angular.result(), cosine.result(), transforms


@pytest.mark.parametrize("mode", ["whole", "layerwise"])
def test_the_last_block_after_the_final_norm_is_the_official_hidden_states_last(mode):
    """distance.py compares ``hidden_states[start]`` with ``hidden_states[end]`` and lstsq.py targets
    ``hidden_states[end]`` (``[1:]`` dropped the embeddings): for a cut ending at the last block that
    state is after the model's final norm. Computed here from ``output_hidden_states`` by hand
    (the angular distance at the last token, the cosine over all tokens, T by torch.linalg.lstsq)."""
    model = tiny_model(num_layers=6)
    with torch.no_grad():  # a norm weight that is not all ones, as trained models have: it moves cosines
        model.model.norm.weight.copy_(torch.rand(model.config.hidden_size, generator=torch.Generator().manual_seed(1)))
    batches = batches_of(random_sequences(6, 5, 12, seed=4), batch_size=3)
    last, inner = (3, 6), (2, 4)
    hand = {"angular": {}, "cosine": {}, "lstsq": {}}
    acts = _official_states(model, batches)
    for start, end in (last, inner):
        angles, cosines, inputs, targets = [], [], [], []
        for states, mlp, mask in acts:
            a, b, m = states[start - 1], states[end - 1], mlp[start - 1]
            rows = mask.sum(1) - 1
            first, second = a[torch.arange(len(rows)), rows].double(), b[torch.arange(len(rows)), rows].double()
            cos = torch.nn.functional.cosine_similarity(first, second, dim=-1).clamp(-1, 1)
            angles.append(torch.arccos(cos) / torch.pi)
            cosines.append(1 - torch.nn.functional.cosine_similarity(a[mask].double(), b[mask].double(), dim=-1))
            inputs.append(m[mask].double())
            targets.append((b + m - a)[mask].double())
        hand["angular"][(start, end)] = float(torch.cat(angles).mean())
        hand["cosine"][(start, end)] = float(torch.cat(cosines).mean())
        hand["lstsq"][(start, end)] = torch.linalg.lstsq(torch.cat(inputs), torch.cat(targets)).solution

    normed = _captured(model, batches, [last, inner], "final_norm", mode)
    plain = _captured(model, batches, [last, inner], "block_output", mode)
    for ours, theirs in zip(normed, hand.values()):
        for cut in (last, inner):
            torch.testing.assert_close(
                torch.as_tensor(ours[cut]).double(), torch.as_tensor(theirs[cut]).double(), rtol=1e-4, atol=1e-5
            )
    for with_norm, without in zip(normed, plain):
        assert not torch.allclose(torch.as_tensor(with_norm[last]), torch.as_tensor(without[last]), rtol=1e-3)
        torch.testing.assert_close(torch.as_tensor(with_norm[inner]), torch.as_tensor(without[inner]))


def test_the_last_block_state_is_the_protocols_unless_typed_and_the_row_records_it():
    official = JobSpec.from_config(compose_config(["experiment=replaceme_official"]))
    paper = JobSpec.from_config(compose_config([]))
    typed_back = JobSpec.from_config(
        compose_config(["experiment=replaceme_official", "capture.last_state=block_output"])
    )
    typed_on = JobSpec.from_config(compose_config(["capture.last_state=final_norm"]))
    assert (official.config.capture.last_state, paper.config.capture.last_state) == ("final_norm", "block_output")
    assert (typed_back.config.capture.last_state, typed_on.config.capture.last_state) == ("block_output", "final_norm")
    assert official.setting_columns()["capture_last_state"] == "final_norm"
    assert paper.setting_columns()["capture_last_state"] == "block_output"
    assert official.config_hash != typed_back.config_hash and typed_on.config_hash != paper.config_hash
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(["capture.last_state=normed"]))
    assert str(err.value).startswith("capture.last_state") and "\n" not in str(err.value)


def test_official_4bit_capture_runs_its_unquantised_parts_in_float16_and_the_papers_in_the_models_dtype(monkeypatch):
    """transformers 4.46.3 loads the parts bitsandbytes leaves unquantised in float16 when no dtype is
    given, as the official code gives none; the row and the hash say so."""
    _without_gpu_checks(monkeypatch)
    base = ["model=llama32_1b_instruct", "model.capture_4bit=true"]
    official = JobSpec.from_config(compose_config(["experiment=replaceme_official", *base]))
    paper = JobSpec.from_config(compose_config(["experiment=replaceme_ls", "calibration=slimorca", *base]))
    assert official.config.model.dtype == paper.config.model.dtype == "bfloat16"
    assert official.effective.capture_dtype == "float16" and official.setting_columns()["capture_dtype"] == "float16"
    assert paper.effective.capture_dtype == "bfloat16" and paper.setting_columns()["capture_dtype"] == "bfloat16"
    unquantised = JobSpec.from_config(compose_config(["experiment=replaceme_official", "model=llama32_1b_instruct"]))
    assert unquantised.effective.capture_dtype == "float32"  # no 4 bits: the float32 copy, as before


def test_official_4bit_capture_runs_sequential_cuts_and_scores_uidl_in_4_bits(monkeypatch):
    """The official code re-quantises the partly pruned model for each sequential cut (no longer refused)
    and scores UIDL's truncated model in 4 bits; ReplaceMe's fused model and every protocol=paper job are
    scored as pruned."""
    _without_gpu_checks(monkeypatch)
    base = ["model=llama32_1b_instruct", "model.capture_4bit=true"]
    sequential = JobSpec.from_config(
        compose_config(["experiment=replaceme_official_cosine", *base, "num_lts=2", "merge_consecutive=false"])
    )
    assert sequential.config.multi_lt == "sequential" and sequential.config.num_lts == 2
    assert sequential.evaluates_in_4bit is False
    assert JobSpec.from_config(compose_config(["experiment=uidl_official", *base])).evaluates_in_4bit is True
    assert JobSpec.from_config(compose_config(["experiment=uidl_official", base[0]])).evaluates_in_4bit is False
    paper = JobSpec.from_config(compose_config(["experiment=uidl_baseline", "calibration=slimorca", *base]))
    assert paper.evaluates_in_4bit is False


def test_an_nf4_copy_is_the_model_saved_and_loaded_back_in_the_unquantised_dtype(monkeypatch):
    """The glue around bitsandbytes (which needs a GPU): with the quantisation config left out, the copy is
    the same model reloaded from disk in the dtype given, and nothing of it stays behind."""
    import tempfile

    from replaceme_exp.models import loading

    seen = {}
    monkeypatch.setattr(loading, "nf4_config", lambda: None)
    made = tempfile.mkdtemp

    def tracked(*args, **kwargs):
        seen["folder"] = made(*args, **kwargs)
        return seen["folder"]

    monkeypatch.setattr(tempfile, "mkdtemp", tracked)
    model = tiny_model("llama", num_layers=3)
    with loading.nf4_copy(model, "float16") as copy:
        assert copy is not model and next(copy.parameters()).dtype == torch.float16
        assert len(copy.model.layers) == 3 and not copy.training
        for (name, a), (_, b) in zip(model.named_parameters(), copy.named_parameters()):
            assert torch.equal(a.to(torch.float16), b), name
    import os

    assert not os.path.exists(seen["folder"])
