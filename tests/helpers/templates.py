"""The shipped multirun templates (``multirun_templates/<group>/<name>.yaml``), how a command line names
one, and the jobs its sweeper parameters expand to."""

from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers.config import CONF, ROOT

# the paper's tables and figures; studies beyond the paper; methods side by side
GROUPS = ("paper", "study", "methods")
TEMPLATES = sorted(
    f"{p.parent.name}/{p.stem}" for group in GROUPS for p in (ROOT / "multirun_templates" / group).glob("*.yaml")
)
# What a user must add to a template: the CLIP template calibrates on their own images (the paper's MIMIC).
USER_OVERRIDES = {"paper/clip": [f"calibration.path={ROOT}"]}


def template_override(template: str) -> str:
    """``paper/regularization`` -> ``+paper=regularization``."""
    group, name = template.split("/")
    return f"+{group}={name}"


def compose_config_with_hydra(template: str):
    """The template composed with its Hydra config (its ``hydra.sweeper.params``)."""
    from hydra import compose, initialize_config_dir

    overrides = [template_override(template), *USER_OVERRIDES.get(template, [])]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=overrides, return_hydra_config=True)


def expand(template: str) -> tuple[object, list[dict]]:
    """The composed template and the jobs its sweeper parameters expand to (their product)."""
    cfg = compose_config_with_hydra(template)
    params = cfg.hydra.sweeper.params or {}
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [(o.key_or_group, list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]) for o in parsed]
    jobs = [{}]
    for key, values in axes:
        jobs = [{**job, key: v} for job in jobs for v in values]
    return cfg, jobs
