"""The shipped multirun templates (``multirun_templates/<group>/<name>.yaml``) and how a command line names one."""

from __future__ import annotations

from helpers.config import ROOT

GROUPS = ("paper", "study")  # the paper's tables and figures; studies beyond the paper
TEMPLATES = sorted(
    f"{p.parent.name}/{p.stem}" for group in GROUPS for p in (ROOT / "multirun_templates" / group).glob("*.yaml")
)


def template_override(template: str) -> str:
    """``paper/regularization`` -> ``+paper=regularization``."""
    group, name = template.split("/")
    return f"+{group}={name}"
