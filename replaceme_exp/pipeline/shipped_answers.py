"""``make self-generated-answers``: the embedded model's own answers to the default job's
calibration prompts, generated afresh (neither the cache nor the shipped file is read) and written
to the shipped answers file, one keyed entry per generation batch, as the cache stores them.

A job copies a shipped batch into its cache only when the batch's key (the model's identity, the
batch's prompts, every generation setting, the torch version) is exactly the one it asks for, so a
stale file costs a generation, never a wrong calibration. Run it after changing the embedded model,
the shipped prompts, the ``self_generated`` generation settings or torch::

    python -m replaceme_exp.pipeline.shipped_answers [override ...]   # default: the default job's
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir

from replaceme_exp.data.generated import SHIPPED_ANSWERS, batch_answers, generation_batches
from replaceme_exp.models.loading import load_model
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.storage import canonical, entry_checksum, write_text

CONF = Path(__file__).resolve().parents[2] / "conf"


def default_spec(overrides: list[str] | None = None) -> JobSpec:
    """The job ``run.py`` composes from ``conf/`` with ``overrides`` (none: the default job)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return JobSpec.from_config(compose("config", overrides=overrides or []))


def entry_lines(entries: list[tuple[dict, dict]]) -> str:
    """JSONL: one ``{"key", "value", "sha256"}`` line per batch (the cache's entry format)."""
    lines = []
    for key, value in entries:
        key, value = canonical(key), canonical(value)
        lines.append(json.dumps({"key": key, "value": value, "sha256": entry_checksum(key, value)}, sort_keys=True))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides (default: the default job)")
    parser.add_argument("--out", default=str(SHIPPED_ANSWERS), help="the JSONL file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # the progress lines
    config = default_spec(args.overrides).config
    if config.calibration.source != "generated":
        parser.error(f"calibration.source={config.calibration.source}: not a self-generated calibration")
    loaded = load_model(config.model, config.cache_dir)
    with tempfile.TemporaryDirectory() as fresh:
        _, batches = generation_batches(config.calibration)
        entries = batch_answers(
            config.calibration, batches, loaded.tokenizer, loaded.model, loaded.identity_hash, fresh, shipped=False
        )
    write_text(args.out, entry_lines(entries))
    where = os.path.relpath(args.out)
    print(f"{len(entries)} batches of answers by {config.model.name} ({loaded.identity_hash}) -> {where}")


if __name__ == "__main__":
    main()
