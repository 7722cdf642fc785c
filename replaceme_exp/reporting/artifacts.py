"""The paper's tables and figures, and the studies beyond it, as one registry: each record names the
sweeps that fill it (their multirun templates and how many jobs each expands to), its cells and its
renderer. Adding a paper table is one record (a ``TableSpec`` in :mod:`.paper_tables`) and one sweep
YAML (``multirun_templates/paper/<name>.yaml``); ``tests/{unit,integration,e2e}/config/test_templates.py`` checks every template
against its record's job count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replaceme_exp.registry import Registry


@dataclass(frozen=True)
class Sweep:
    """A multirun template (``paper/<name>``, ``study/<name>`` or ``methods/<name>``: ``python run.py -m
    +paper=<name>``) and the number of jobs it expands to."""

    template: str
    jobs: int

    @property
    def override(self) -> str:
        group, name = self.template.split("/")
        return f"+{group}={name}"


@dataclass(frozen=True)
class PaperArtifact:
    """A table, a figure or a study: ``kind``, its ``sweeps`` and ``spec`` (the table's or figure's
    own record, which holds its cells and how it is drawn; None for a study, shown by ``make report``)."""

    name: str
    kind: str
    sweeps: tuple[Sweep, ...]
    spec: Any = None


PAPER_ARTIFACTS: Registry[PaperArtifact] = Registry("paper", "paper table, figure or study")


def register(name: str, kind: str, sweeps: tuple[Sweep, ...], spec: Any = None) -> PaperArtifact:
    return PAPER_ARTIFACTS.register(name, PaperArtifact(name, kind, tuple(sweeps), spec))


def template_jobs() -> dict[str, int]:
    """Every registered sweep's template and its job count."""
    return {sweep.template: sweep.jobs for _, artifact in PAPER_ARTIFACTS.items() for sweep in artifact.sweeps}


# Studies beyond the paper: shown by ``make report`` (no table or figure of their own).
register("sink_tokens", "study", (Sweep("study/sink_tokens", 384),))
