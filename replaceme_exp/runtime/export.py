"""The pruned checkpoint of a job that saved its transforms (``save_model=transform``, the default),
built on demand: reload the base model the job pruned, apply the saved cuts and transforms with the
project's own surgery, save the checkpoint under ``results_dir/models/<config_hash>`` (as
``save_model=full`` would have; ``job=evaluate evaluate.checkpoint=<that folder>`` evaluates it).

    python -m replaceme_exp.runtime.export <config_hash> [--results-dir results] [--out DIR]
    make export RUN=<config_hash>

The job's configuration is read from its recipe and checked again: the base model's weights must
still have the fingerprint the job recorded (the config hash is recomputed and must be the job's),
else the export refuses in one line rather than build another model under the job's name. Fused
weights are formed in float64 on the export's device: on the job's kind of device the checkpoint
equals the one ``save_model=full`` saves, bit for bit.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from replaceme_exp.errors import ConfigError, first_line
from replaceme_exp.estimation.fitting import label
from replaceme_exp.models import adapter_for, load_model
from replaceme_exp.models.fingerprint import weights_fingerprint
from replaceme_exp.pipeline import JobSpec
from replaceme_exp.surgery import (
    NETWORK_PREFIX,
    apply_recipe,
    block_states_from_tensors,
    networks_from_tensors,
    read_recipe,
    save_checkpoint,
)

log = logging.getLogger("replaceme_exp.export")


def saved_transforms(file: Path, recipe: dict) -> dict:
    """``{cut: T}`` from a transforms file, each T cast back to the dtype it was fitted in (the
    file holds float64); cuts without a T (identity) map to None."""
    tensors = load_file(str(file))
    dtypes = recipe.get("dtypes", {})
    out = {}
    for start, end in recipe["cuts"]:
        name = label((start, end))
        tensor = tensors.get(name)
        out[(start, end)] = None if tensor is None else tensor.to(getattr(torch, dtypes.get(name, "float64")))
    return out


def export_checkpoint(
    results_dir: str | Path, config_hash: str, cache_dir: str | Path | None = None, out: str | Path | None = None
) -> Path:
    """Build and save the pruned checkpoint of the job ``config_hash`` of ``results_dir`` from its
    recipe (``transforms/<config_hash>.recipe.json``); returns the checkpoint's folder (default
    ``results_dir/models/<config_hash>``). ``cache_dir``: where the base model's converted weights
    live (default: the job's). Raises :class:`ConfigError` when the recipe is missing or the base
    model changed."""
    results_dir = Path(results_dir)
    transforms_file = results_dir / "transforms" / f"{config_hash}.safetensors"
    try:
        recipe = read_recipe(transforms_file)
    except (FileNotFoundError, ValueError) as err:
        reason = f"no saved transforms to export ({err}); a job with save_model=transform saves them"
        raise ConfigError("RUN", config_hash, reason) from None
    spec = JobSpec.from_config(recipe["config"])
    cache_dir = Path(cache_dir if cache_dir is not None else spec.config.cache_dir)
    spec = spec.with_weights(weights_fingerprint(spec.config.model, cache_dir))
    if spec.config_hash != config_hash:
        reason = (
            f"the base model {spec.config.model.name} or this code's semantics changed since the job ran "
            f"(its config hash is now {spec.config_hash}): rerun the job"
        )
        raise ConfigError("RUN", config_hash, reason)
    loaded = load_model(spec.config.model, cache_dir, spec.weights)
    adapter = adapter_for(loaded.model)
    cuts = [tuple(cut) for cut in recipe["cuts"]]
    transforms = saved_transforms(transforms_file, recipe)
    states = block_states_from_tensors(load_file(str(transforms_file))) if recipe.get("block_states") else {}
    networks = networks_from_tensors(load_file(str(transforms_file)), NETWORK_PREFIX) if recipe.get("networks") else {}
    kept = apply_recipe(adapter, cuts, transforms, recipe["lt_placement"], recipe["sequential"], states, networks)
    if kept != (recorded := recipe["metadata"].get("kept_blocks", kept)):
        raise ConfigError("RUN", config_hash, f"the recipe keeps blocks {kept}, the job kept {recorded}")
    target = Path(out) if out is not None else results_dir / "models" / config_hash
    return save_checkpoint(loaded.model, loaded.tokenizer, target, recipe["metadata"], loaded.processor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config_hash", help="the job's config_hash (its row's config_hash column)")
    parser.add_argument("--results-dir", default="results", help="the results store (default: results)")
    parser.add_argument("--cache-dir", default=None, help="the base model's cache (default: the job's cache_dir)")
    parser.add_argument("--out", default=None, help="where the checkpoint goes (default: results/models/<hash>)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        target = export_checkpoint(args.results_dir, args.config_hash, args.cache_dir, args.out)
    except ConfigError as err:
        print(f"export: {first_line(err)}", file=sys.stderr)
        return 2
    print(f"exported {args.config_hash}: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
