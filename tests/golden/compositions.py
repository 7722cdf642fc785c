"""The configurations whose identity is pinned (``tests/golden/config_identity.json``): every shipped
option of every config group, every method preset, every job of every multirun template, the settings
whose effective value differs from their spelling, and the robustness tests' bad inputs.

Each entry is a list of Hydra overrides on top of the default job. The pinned file was written from
commit 3c73b47, before the job spec existed, and stays as it is. A change of what a configuration
computes changes its hashes on purpose: name the change in ``IDENTITY_CHANGES`` (a tag and why) and run
``python tests/golden/compositions.py --change <tag>``, which records the new hashes of the
compositions whose hashes moved in ``identity_changes.json`` under that tag (only the ones not
recorded yet), with the whole identity of compositions that did not exist (``added``: a new option
or template job) and a mark on pinned ones no longer composed (``retired``); the test then expects
those."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
TEMPLATES = ROOT / "multirun_templates"
GOLDEN = Path(__file__).with_name("config_identity.json")
CHANGES = Path(__file__).with_name("identity_changes.json")
HASHES = ("config_hash", "setting_hash", "config_hash_weights", "setting_hash_weights")
# Changes of what a configuration computes, by tag: each moved the hashes recorded under its tag.
IDENTITY_CHANGES = {
    "healing-master-weights": "issue 22: bf16/fp16 weights that heal (full_model; lt_only's separate T) train "
    "through float32 master weights (healing.master_weights=float32, the default, enters the hash; "
    "master_weights=model keeps the hash of before)",
    "pruned-layers-cosine": "issue 22: the pruned-layers figure and the higher-compression table run the paper's "
    "'ReplaceMe Adam' (experiment=replaceme_cosine) instead of LS, at 1-7 blocks (Falcon 1-15, its own template)",
    "official-presets": "issue 22: experiment=replaceme_official, replaceme_official_cosine and uidl_official "
    "prune 8 blocks and run eval=paper, as the official reproduce configs do",
    "regularizer-to-identity": "issue 22: the regularizer options l1_to_identity and l2_to_identity (new)",
    "fewshot-seed": "issue 22: lm-eval suites sample few-shot examples with eval.harness.fewshot_seed (1234, "
    "lm-eval's default and the official code's) instead of the job's seed, which no longer moves scores",
    "significance-seeds": "issue 22: +paper=llama3_main's seeds vary only the solver (calibration.seed fixed at 42)",
    "solvers-table": "issue 22: +paper=solvers runs the non-Adam solvers in the official minibatch schedule and "
    "adds newton_cg; +paper=solvers_sanity runs the table's MSE + Adam and LS rows",
    "official-datasets": "issue 22: calibration presets for the official code's C4, WikiText-2 and sec-data-mini (new)",
    "renderer-rows": "issue 22: the structured_lts table's UIDL and Generic non-consecutive rows and the "
    "cosine_approximation table's Multi_A rows get their templates (structured_lts_uidl_nc, "
    "cosine_approximation_multi_a) and the preset experiment=multi_lt_nc_ls (new)",
    "pwcca": "issue 22: selection=pwcca (new), and +paper=block_selection records CKA, mean CCA and PWCCA over "
    "the calibration tokens (record_calibration_similarity=true)",
    "protocol-axis": "issue 22: protocol=paper|official (pipeline/protocol.py) and the official code's settings it "
    "sets (padded positions, float32 capture, batches in order with the last incomplete one dropped, touching cuts "
    "composed); the official presets become protocol=official with calibration=slimorca",
    "official-transforms": "issue 22: the official code's Adam-path options structure=rank1 (two_vectors), "
    "structure=lower_triangular (thri) and objective=elasticnet (new; objective=ls refuses the two structures)",
    "peer-methods": "issue 25: the peer depth-pruning methods and the ridge toward the identity (new): "
    "selection=shortgpt, sleb, laco, channel_cosine; objective=linear_patch, streamline_ffn, streamline_layer, "
    "ls_ridge_identity; healing=linearpatch_kl, healing/data=wikitext2; their presets and replaceme_ls_sink_aware; "
    "+paper=llama2_comparison and llama3_main also run experiment=llm_streamline and laco",
    "solver-precision": "objective.precision: the non-Adam solvers (lbfgs, nlcg, trust_ncg, newton_cg) compute T in "
    "float64 by default (in float32 their line searches decided on rounding noise: an L-BFGS step moved with the "
    "CPU's vector kernels); precision=float32, the official code's and protocol=official's, keeps the hash of before",
    "gemma3-models": "model=gemma3_270m (Gemma 3 270M embedded in wheels) and model=tiny_gemma3 (new); both set "
    "lt_placement=separate (a norm follows the MLP down-projection)",
    "offline-tasks": "eval=quick (the default job's suite) runs lm-eval on the first 40 items of the offline tasks "
    "(world facts, docstring cloze, docstring minimal pairs) besides held-out perplexity, eval=offline runs all their "
    "items instead of the two toy tasks, and the perplexity-only suite is eval=heldout (new)",
    "shortgpt-cuts": "issue 35: experiment=replaceme_ls_shortgpt_cuts (new): a least-squares transform over each run "
    "of the blocks ShortGPT's Block Influence removes (selection=shortgpt with objective=ls, refused before)",
}
GROUPS = (
    "model",
    "calibration",
    "selection",
    "objective",
    "estimation",
    "regularizer",
    "structure",
    "healing",
    "eval",
    "capture",
    "store",
    "tracking",
    "experiment",
)
# Options that only compose with a companion override (a user's folder or dataset).
# Paths are relative to the repository root, where the tests run.
COMPANIONS = {
    ("calibration", "image_folder"): ["calibration.path=tests/golden"],
    ("calibration", "hub_images"): ["calibration.dataset=owner/images"],
    ("calibration", "jsonl"): ["calibration.path=tests/golden/sample.jsonl"],
    ("calibration", "text_file"): ["calibration.path=tests/golden/sample.txt"],
    ("paper", "clip"): ["calibration.path=tests/golden"],
}
# Spellings whose effective settings differ from what was typed
# (the rules old results/identity.py applied, now JobSpec's).
EQUIVALENCES = [
    ["alpha=0"],
    ["alpha=0.0"],
    ["alpha=10"],
    ["alpha=10.0"],
    ["regularizer=none"],
    ["regularizer=none", "alpha=0"],
    ["objective=identity"],
    ["objective=identity", "alpha=5"],
    ["objective=identity", "structure=diagonal"],
    ["objective=identity", "lt_placement=separate"],
    ["objective=identity", "selection=ls_residual", "alpha=3"],
    ["objective=identity", "selection=ls_residual", "lt_placement=separate"],
    ["objective=identity", "estimation=skip_first"],
    ["objective=identity", "selection=ls_residual", "estimation=skip_first"],
    ["selection=ls_residual", "alpha=2"],
    ["selection=cka"],
    ["selection=cca"],
    ["selection=uidl"],
    ["cuts=[[20,28]]"],
    ["cuts=[[20,28]]", "n_prune=8"],
    ["cuts=[[20,28]]", "selection=uidl"],
    ["cuts=[[10,12],[20,22]]", "merge_consecutive=false"],
    ["cuts=[[10,12],[12,14]]"],
    ["num_lts=2"],
    ["num_lts=2", "merge_consecutive=false"],
    ["num_lts=2", "multi_lt=sequential"],
    ["merge_consecutive=false"],
    ["multi_lt=sequential"],
    ["n_prune=0.25"],
    ["n_prune=8", "num_lts=4"],
    ["mask_ratio=0.2"],
    ["mask_ratio=0.2", "mask_passes=3"],
    ["mask_ratio=0", "mask_passes=3"],
    ["mask_ratio=0.0"],
    ["estimation=skip_first"],
    ["estimation=skip_first", "estimation.first=2"],
    ["estimation=all", "estimation.first=3"],
    ["estimation=skip_massive", "estimation.massive_threshold=30"],
    ["estimation.massive_threshold=20"],
    ["objective=cosine"],
    ["objective=cosine", "solver_schedule=minibatch"],
    ["objective=cosine", "objective.solver=lbfgs"],
    ["objective=cosine", "objective.solver=lbfgs", "solver_schedule=minibatch"],
    ["objective=cosine", "objective.init=ls"],
    ["objective=cosine", "regularizer=l1", "alpha=0.0001"],
    ["objective=cosine", "alpha=0.01"],
    ["objective=mse", "alpha=3"],
    ["objective=cosine_exact", "objective.solver=trust_ncg"],
    ["structure=diagonal"],
    ["structure=orthonormal"],
    ["lt_placement=separate"],
    ["solver_schedule=minibatch"],
    ["capture.precision=float32"],
    ["capture.precision=float32", "objective=identity"],
    ["capture.precision=float32", "objective=identity", "selection=cka"],
    ["capture.precision=float64"],
    ["capture.mode=layerwise"],
    ["capture.passes=two"],
    ["capture.cache=false"],
    ["store.location=disk"],
    ["healing=none", "healing.max_steps=3"],
    ["healing=lora", "healing.log_every=7"],
    ["healing=lt_only", "healing.gradient_checkpointing=false"],
    ["healing=lt_only", "healing/data=pydoc"],
    ["healing=full_model", "healing/data=text_file", "healing.data.path=tests/golden/sample.txt"],
    ["eval=offline", "eval.samples=null"],
    ["eval.samples.max_new_tokens=8"],
    ["eval=paper", "eval.harness.batch_size=16"],
    ["seed=1"],
    ["seed=1", "calibration.seed=42"],
    ["record_layer_distances=true"],
    ["results_dir=/elsewhere", "cache_dir=/elsewhere/cache", "save_model=false", "force=true"],
    ["model.device=cpu", "model.device_map=auto"],
    ["progress.mode=off"],
    ["tracking.wandb.mode=disabled"],
    [
        "model=tiny_llama",
        "calibration=pydoc",
        "n_prune=2",
        "calibration.n_samples=24",
        "calibration.seq_len=64",
        "eval.seq_len=64",
        "eval.max_windows=4",
        "tracking.wandb.mode=disabled",
        "tracking.codecarbon.enabled=false",
    ],
]
# The protocol axis and the official code's settings it sets (each also on its own).
EQUIVALENCES += [
    ["protocol=official"],
    ["protocol=paper"],
    ["protocol=official", "experiment=replaceme_ls"],
    ["protocol=official", "experiment=replaceme_cosine"],
    ["protocol=official", "experiment=replaceme_cosine", "num_lts=2", "merge_consecutive=false"],
    ["protocol=official", "experiment=uidl_baseline"],
    ["protocol=official", "experiment=replaceme_ls", "selection=cka"],
    ["protocol=official", "calibration=slimorca_fineweb"],
    ["protocol=official", "calibration=slimorca", "calibration.order=shuffled"],
    ["estimation=all", "estimation.padded_positions=true"],
    ["estimation=all", "estimation.padded_positions=true", "objective=identity"],
    ["model.capture_dtype=float32"],
    ["model.capture_dtype=float32", "model.dtype=float32"],
    ["calibration.drop_last=true"],
    ["calibration.batch_order=as_read"],
    ["num_lts=2", "merge_consecutive=false", "touching_cuts=compose"],
    ["num_lts=2", "touching_cuts=compose"],
    ["cuts=[[10,12],[12,14]]", "merge_consecutive=false", "touching_cuts=compose"],
]
# tests/test_robustness.py's bad inputs: they compose; their identity is pinned too.
BAD_INPUTS = [
    "calibration.padding_side=middle",
    "merge_consecutive=abc",
    "cuts=[[true,3]]",
    "cuts=5",
    "capture.passes=bogus",
    "tracking.wandb.mode=bogus",
    "alpha=abc",
    "alpha=nan",
    "alpha=inf",
    "seed=abc",
    "eval.batch_size=0",
    "eval.batch_size=-1",
    "model.device=bogus",
    "objective=cosine objective.epochs=0",
    "objective=cosine objective.batch_tokens=0",
    "objective=cosine objective.chunk_tokens=0",
    "objective=cosine objective.lr=-1",
    "mask_ratio=2",
    "num_lts=0",
]


def group_options() -> list[list[str]]:
    out = []
    for group in GROUPS:
        for path in sorted((CONF / group).glob("*.yaml")):
            out.append([f"{group}={path.stem}", *COMPANIONS.get((group, path.stem), [])])
    for path in sorted((CONF / "healing" / "data").glob("*.yaml")):
        extra = ["healing.data.path=tests/golden/sample.txt"] if path.stem == "text_file" else []
        out.append(["healing=lt_only", f"healing/data={path.stem}", *extra])
    return out


def template_jobs() -> list[list[str]]:
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    import replaceme_exp.pipeline  # noqa: F401  (the config schema in Hydra's ConfigStore)

    out = []
    for group in ("paper", "study"):
        for path in sorted((TEMPLATES / group).glob("*.yaml")):
            base = [f"+{group}={path.stem}", *COMPANIONS.get((group, path.stem), [])]
            with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
                cfg = compose("config", overrides=base, return_hydra_config=True)
            params = cfg.hydra.sweeper.params or {}
            parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
            jobs = [[]]
            for o in parsed:
                values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
                text = [
                    "null" if v is None else str(v).replace(" ", "") if isinstance(v, list) else str(v) for v in values
                ]
                jobs = [job + [f"{o.key_or_group}={v}"] for job in jobs for v in text]
            out.extend(base + job for job in jobs)
    return out


def all_compositions() -> list[list[str]]:
    """Everything pinned: every option, preset, special spelling, bad input and template job."""
    return [[]] + group_options() + EQUIVALENCES + [override.split() for override in BAD_INPUTS] + template_jobs()


def checked_compositions() -> list[list[str]]:
    """What the test composes (each composition costs about 0.2 s): everything but the template jobs,
    and of each template every job its sweep axes expand to at a stride of about a sixth, as
    tests/test_templates.py composes them (about 140 of the 596)."""
    by_template: dict[str, list[list[str]]] = {}
    for job in template_jobs():
        by_template.setdefault(job[0], []).append(job)
    strided = [job for jobs in by_template.values() for job in jobs[:: max(1, len(jobs) // 6)]]
    return [[]] + group_options() + EQUIVALENCES + [override.split() for override in BAD_INPUTS] + strided


def key(overrides: list[str]) -> str:
    return " ".join(overrides) or "<default>"


def composed(compositions: list[list[str]], cache_dir: str):
    """Each composition's config (in one Hydra context: composing is the slow part)."""
    from hydra import compose, initialize_config_dir

    import replaceme_exp.pipeline  # noqa: F401  (the config schema in Hydra's ConfigStore)

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for overrides in compositions:
            yield overrides, compose("config", overrides=[*overrides, f"cache_dir={cache_dir}"])


WEIGHTS = {"kind": "golden", "sha256": "0" * 64}


def current_identity(cfg) -> dict:
    """What the code computes for one composition: config hash and setting hash (without weights,
    and with a fixed weights fingerprint) and the row's setting columns; ``valid``, or the one-line
    error that refuses the configuration. (The pinned file was written by the same function over the
    API of commit 3c73b47: ``results.identity`` and ``job.base_row``.)"""
    from replaceme_exp.errors import ConfigError
    from replaceme_exp.pipeline.spec import JobSpec

    try:
        spec = JobSpec.from_config(cfg)
    except ConfigError as err:
        return {"valid": f"error: ConfigError: {err}", "row_settings": f"error: ConfigError: {err}"}
    weighted = spec.with_weights(WEIGHTS)
    return {
        "config_hash": spec.config_hash,
        "setting_hash": spec.setting_hash,
        "config_hash_weights": weighted.config_hash,
        "setting_hash_weights": weighted.setting_hash,
        "row_settings": spec.setting_columns(),
        "valid": "valid",
    }


def expected_hashes(pinned: dict, changes: dict, name: str) -> dict:
    """The hashes a composition should have now: the latest recorded change, else the pinned ones."""
    return {k: (changes.get(name) or pinned[name])[k] for k in HASHES}


def record_change(tag: str) -> None:
    """Record under ``tag`` the hashes of every composition whose hashes moved (see the module)."""
    import tempfile

    if tag not in IDENTITY_CHANGES:
        raise SystemExit(f"--change {tag}: name it in IDENTITY_CHANGES first (known: {sorted(IDENTITY_CHANGES)})")
    pinned = json.loads(GOLDEN.read_text())
    changes = json.loads(CHANGES.read_text()) if CHANGES.is_file() else {}
    counts = {"moved": 0, "added": 0, "retired": 0}
    names = set()
    with tempfile.TemporaryDirectory() as cache_dir:
        for overrides, cfg in composed(all_compositions(), cache_dir):
            name, now = key(overrides), current_identity(cfg)
            names.add(name)
            if name not in pinned:  # a composition that did not exist (a new option or template job)
                if name not in changes or {k: now.get(k) for k in HASHES} != {k: changes[name].get(k) for k in HASHES}:
                    counts["added" if name not in changes else "moved"] += 1
                    changes[name] = {"change": tag, "added": True, **now}
                continue
            if now["valid"] != "valid" or pinned[name]["valid"] != "valid":
                continue
            if {k: now[k] for k in HASHES} != expected_hashes(pinned, changes, name):
                changes[name] = {"change": tag, **{k: now[k] for k in HASHES}, "row_settings": now["row_settings"]}
                counts["moved"] += 1
    for name in sorted(set(pinned) - names - set(changes)):
        changes[name] = {"change": tag, "retired": True}
        counts["retired"] += 1
    CHANGES.write_text(json.dumps(changes, indent=1, sort_keys=True) + "\n")
    print(f"{counts} compositions recorded under {tag} in {CHANGES}", file=sys.stderr)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--change", required=True, help=f"the tag of the change ({', '.join(IDENTITY_CHANGES)})")
    record_change(parser.parse_args().change)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
