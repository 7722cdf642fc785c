"""The row-column reference (``docs/row-columns.md``), generated from the code that declares a row's
columns, so it cannot drift from what a job writes:

    python -m replaceme_exp.reporting.row_reference > docs/row-columns.md     (make docs-reference)

The names come from running that code: :func:`~replaceme_exp.results.row.start_row` and
:func:`~replaceme_exp.results.row.refused_row` (the columns every row starts with),
:func:`~replaceme_exp.results.row.skip_row` (a skipped job's row) and
:meth:`~replaceme_exp.pipeline.spec.JobSpec.setting_columns` of the default pruning job and of an
evaluate job (the settings as they act); the meanings from :mod:`replaceme_exp.results.columns` and the
methods' plugins (a method's own columns).
``tests/unit/results/test_row_reference.py`` fails when the file differs from what this prints or a declared
column has no meaning.
"""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import replaceme_exp.pipeline  # noqa: F401  (the config schema in Hydra's ConfigStore, as run.py has it)
from replaceme_exp.methods import METHODS, column_meaning
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.results import columns
from replaceme_exp.results.columns import MEASURED_COLUMNS
from replaceme_exp.results.row import refused_row, skip_row, start_row

CONF = Path(__file__).resolve().parents[2] / "conf"
UNDESCRIBED = "*(no meaning in `replaceme_exp/results/columns.py` yet)*"


def job_spec(overrides: list[str]) -> JobSpec:
    """The job spec of the shipped configuration with ``overrides`` (composed as run.py composes it)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return JobSpec.from_config(compose("config", overrides=overrides))


def declared_columns() -> dict[str, list[str]]:
    """The columns the code declares, by section, in the order a row holds them."""
    prune = job_spec([])
    evaluate = job_spec(["job=evaluate"])
    settings = list(prune.setting_columns())
    started = [c for c in start_row("", "", None, {}) if c not in settings]
    refused = [c for c in refused_row(OmegaConf.create({}), ValueError("x"), None) if c not in started + settings]
    evaluation = [c for c in evaluate.setting_columns() if c not in settings]
    skipped = list(skip_row({"config_hash": "", "run_id": ""}, None))
    return {
        "identity": started + refused,
        "pruning settings": settings,
        "evaluate settings": evaluation,
        "skipped job": skipped,
    }


def meaning(column: str) -> str | None:
    """What ``column`` means: the harness's columns (:mod:`replaceme_exp.results.columns`), then a
    method's own (its plugin's ``setting_columns``)."""
    return columns.meaning(column) or column_meaning(column)


def undescribed() -> list[str]:
    """Declared columns without a meaning."""
    return [c for columns in declared_columns().values() for c in columns if meaning(c) is None]


def _rows(columns: list[str]) -> list[str]:
    return [f"| `{c}` | {meaning(c) or UNDESCRIBED} |" for c in columns]


def _table(rows: list[str]) -> list[str]:
    """A markdown table of columns and their meanings, ``rows`` its body."""
    return ["| column | meaning |", "|---|---|", *rows]


def _declared_sections(declared: dict[str, list[str]]) -> list[str]:
    """The page's sections of the columns the code declares (:func:`declared_columns`), markdown lines."""
    return [
        "## Identity and provenance",
        "",
        "Every row starts with these (a configuration refused before it ran has the ones it can know).",
        "",
        *_table(_rows(declared["identity"])),
        "",
        "## Settings",
        "",
        "Each setting as it acts: None where it cannot act (selection with explicit `cuts`, masking keys",
        "without masking, solver settings of a closed form, ...); the config hash is taken over the same",
        "effective settings.",
        "",
        *_table(_rows(declared["pruning settings"])),
        "",
        "An evaluate job (`job=evaluate`) has the same setting columns, None where a pruning setting",
        "cannot act, and these:",
        "",
        *_table(_rows(declared["evaluate settings"])),
        "",
        "## A skipped job's row",
        "",
        "A job whose configuration already has a finished row is skipped (unless `force=true`): it runs",
        "nothing and writes this small row, `results_dir/skips/<config_hash>/<run_id>.parquet`, so that",
        "its sweep's report lists it with the run that finished it. It is no run: `ResultsStore.load()`",
        "and every table read `runs/` only; `ResultsStore.load_skips()` reads these.",
        "",
        *_table(_rows(declared["skipped job"])),
        "",
    ]


def render() -> str:
    """The row-column reference, markdown: the declared columns, the measured ones, each method's own."""
    out = [
        "# Row columns",
        "",
        "Generated by `make docs-reference` from the code that declares a row's columns",
        "(`replaceme_exp/results/row.py`, `JobSpec.setting_columns` in `replaceme_exp/pipeline/spec.py`) and",
        "their meanings in `replaceme_exp/results/columns.py`; do not edit. Every job writes one row,",
        "`results_dir/runs/<config_hash>/<run_id>.parquet`; lists and mappings are JSON text",
        "(`replaceme_exp.results.row.decode_cell` reads them back). A number a run did not record is",
        "missing (None), never filled in.",
        "",
        *_declared_sections(declared_columns()),
        "## Measured columns",
        "",
        "What the stages add (`<...>` stands for a task, stage, benchmark or one of the alternatives",
        "listed). Which of them a row has depends on the job: an lm-eval suite adds task scores, CLIP",
        "benchmark scores, healing its `healing_*` columns.",
        "",
        *_table([f"| `{name}` | {text} |" for name, text in MEASURED_COLUMNS.items()]),
        "",
        "## Each method's own columns",
        "",
        "What a method's search or fit records, declared by its plugin (`replaceme_exp/methods/<method>.py`);",
        "every other row leaves them out (its setting columns above: None).",
        *[line for name, method in METHODS.items() if method.column_docs for line in _method_rows(method)],
    ]
    return "\n".join(out) + "\n"


def _method_rows(method) -> list[str]:
    return [
        "",
        f"### {method.title} (`{method.name}`)",
        "",
        *_table([f"| `{n}` | {t} |" for n, t in method.column_docs.items()]),
    ]


if __name__ == "__main__":
    print(render(), end="")
