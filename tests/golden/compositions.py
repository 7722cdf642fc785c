"""The configurations whose identity is pinned: every shipped option of every config group, every
method preset, every job of every multirun template, the settings whose effective value differs from
their spelling, and the robustness tests' bad inputs.

Each entry is a list of Hydra overrides on top of the default job. ``identity.json`` holds what each
computes now: its config and setting hashes (without weights, and with a fixed weights fingerprint)
and its row's setting columns, or the one line that refuses it. ``identity_log.json`` is the history,
one named change after another: why, and which compositions it moved (their hashes before and
after), added, retired or described anew (setting columns changed, hashes not).

A change of what a configuration computes changes its identity on purpose: run
``python tests/golden/compositions.py --change <tag> --why "<what and why>"``, which rewrites
``identity.json`` and appends the change to the log; the test then expects the new identity. A
refactor records nothing: the test holds it to ``identity.json``."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
TEMPLATES = ROOT / "multirun_templates"
IDENTITY = Path(__file__).with_name("identity.json")
LOG = Path(__file__).with_name("identity_log.json")
HASHES = ("config_hash", "setting_hash", "config_hash_weights", "setting_hash_weights")
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
    "protocol",
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
    # the protocol as a config group: typed choices, peer presets, masking, 4-bit and vision under it
    ["protocol=official", "selection=cosine"],
    ["protocol=official", "model.dtype=float32", "multi_lt=independent", "objective=cosine", "num_lts=2"],
    ["protocol=official", "experiment=llm_streamline"],
    ["protocol=official", "experiment=shortgpt"],
    ["protocol=official", "experiment=linearpatch"],
    ["protocol=official", "objective=cosine", "estimation=all", "mask_ratio=0.25"],
    ["protocol=official", "experiment=replaceme_official", "model=llama32_1b_instruct", "model.capture_4bit=true"],
    ["protocol=official", "model=tiny_clip", "calibration=bundled_images", "eval=clip_offline"],
]
# tests/{unit,integration,e2e}/pipeline/test_robustness.py's bad inputs: they compose; their identity is pinned too.
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
    tests/{unit,integration,e2e}/config/test_templates.py composes them (about 140 of the 596)."""
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


def portable(value, cache_dir: str):
    """``value`` with this checkout's path and the cache folder spelled ``<repo>`` and ``<cache_dir>``."""
    if isinstance(value, str):
        return value.replace(cache_dir, "<cache_dir>").replace(str(ROOT), "<repo>")
    if isinstance(value, dict):
        return {k: portable(v, cache_dir) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, cache_dir) for v in value]
    return value


def current_identity(cfg, cache_dir: str) -> dict:
    """What the code computes for one composition: its config and setting hashes (without weights,
    and with a fixed weights fingerprint) and the row's setting columns, or the one line that
    refuses it (``refused``), in JSON's types."""
    from replaceme_exp.errors import ConfigError
    from replaceme_exp.pipeline.spec import JobSpec

    try:
        spec = JobSpec.from_config(cfg)
    except ConfigError as err:
        return {"refused": portable(str(err), cache_dir)}
    weighted = spec.with_weights(WEIGHTS)
    identity = {
        "config_hash": spec.config_hash,
        "setting_hash": spec.setting_hash,
        "config_hash_weights": weighted.config_hash,
        "setting_hash_weights": weighted.setting_hash,
        "row_settings": spec.setting_columns(),
    }
    return portable(json.loads(json.dumps(identity)), cache_dir)


def compute_all() -> dict[str, dict]:
    """The current identity of every composition, by name."""
    with tempfile.TemporaryDirectory() as cache_dir:
        return {key(o): current_identity(cfg, cache_dir) for o, cfg in composed(all_compositions(), cache_dir)}


def hashes_of(identity: dict) -> dict:
    """What a log entry keeps of an identity: its hashes, or its refusal."""
    return {"refused": identity["refused"]} if "refused" in identity else {k: identity[k] for k in HASHES}


def record_change(tag: str, why: str) -> None:
    """Rewrite ``identity.json`` from the code and log what moved under ``tag`` (see the module)."""
    log = json.loads(LOG.read_text())
    if tag in {entry["change"] for entry in log}:
        raise SystemExit(f"--change {tag}: the log has a change of that name already; name this one anew")
    before, now = json.loads(IDENTITY.read_text()), compute_all()
    common = sorted(set(before) & set(now))
    entry = {
        "change": tag,
        "why": why,
        "moved": {
            n: {"from": hashes_of(before[n]), "to": hashes_of(now[n])}
            for n in common
            if hashes_of(before[n]) != hashes_of(now[n])
        },
        "added": sorted(set(now) - set(before)),
        "retired": sorted(set(before) - set(now)),
        "described": [n for n in common if hashes_of(before[n]) == hashes_of(now[n]) and before[n] != now[n]],
    }
    LOG.write_text(json.dumps([*log, entry], indent=1) + "\n")
    IDENTITY.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    counts = {k: len(entry[k]) for k in ("moved", "added", "retired", "described")}
    print(f"{counts} compositions recorded under {tag} in {LOG}", file=sys.stderr)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--change", required=True, help="a new name for the change")
    parser.add_argument("--why", required=True, help="what changed, and why (the issue, the setting)")
    args = parser.parse_args()
    record_change(args.change, args.why)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
