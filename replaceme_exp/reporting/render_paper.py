"""``make paper-tables``: the paper's tables and figures from the results store, and per table
and figure how many runs were found, matched and shown.

    python -m replaceme_exp.reporting.render_paper --results results --out results/paper_tables
    python -m replaceme_exp.reporting.render_paper --model tiny_llama [--calibration pydoc] [--eval quick]
    python -m replaceme_exp.reporting.render_paper --model smollm2_135m --only methods_equal_compression

Runs of ``protocol=official`` (what the official code ran) are rendered apart, into
``<out>/protocol_official/`` (``--protocol`` picks one). With ``--model`` / ``--calibration`` /
``--eval`` the same tables and figures are rendered from
runs of another model, calibration set or suite (``paper_settings.Target``; with only a model,
the calibration and suite are its runs' most common ones) into ``<out>/<model>[_<calibration>]
[_<eval>]/``, so that the paper's own tables in ``<out>`` are not overwritten. ``--only`` renders
the named tables and figures alone (``make methods-table``: the methods table).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import pandas as pd

from replaceme_exp.reporting.paper_figures import FIGURES, write_paper_figures
from replaceme_exp.reporting.paper_settings import Target, resolve_target
from replaceme_exp.reporting.paper_tables import TABLES, write_paper_tables
from replaceme_exp.reporting.paths import file_name
from replaceme_exp.results.store import ResultsStore


def describe_rows(runs: pd.DataFrame, results: str | Path) -> str:
    """``read 7 rows (7 finished, 0 failed) from results`` (rows: the latest per config)."""
    statuses = Counter(runs["status"]) if "status" in runs.columns else Counter()
    finished, failed = statuses.pop("finished", 0), statuses.pop("failed", 0)
    other = "".join(f", {n} {status}" for status, n in sorted(statuses.items()))
    return f"read {len(runs)} rows ({finished} finished, {failed} failed{other}) from {results}"


def out_folder(out: str | Path, target: Target) -> Path:
    """``out`` for the paper's settings, ``out/<model>[_<calibration>][_<eval>]`` when retargeted
    (one folder, whatever the names: :func:`~replaceme_exp.reporting.paths.file_name`)."""
    return Path(out) / file_name(target.folder()) if target.retargeted else Path(out)


def protocols_to_render(runs: pd.DataFrame, protocol: str | None) -> list[str]:
    """``[protocol]`` when one is asked for; else ``paper``, and ``official`` too when some
    finished run ran under it (rows from before the protocol column are ``paper``)."""
    if protocol is not None:
        return [protocol]
    ran = set(runs["protocol"].dropna()) if "protocol" in runs.columns else set()
    return ["paper"] + (["official"] if "official" in ran else [])


def render(
    results: str | Path,
    out: str | Path,
    model: str | None = None,
    calibration: str | None = None,
    eval: str | None = None,  # noqa: A002 - the config group's name
    echo=print,
    protocol: str | None = None,
    only: list[str] | None = None,
) -> list[Path]:
    """Write every table and figure (retargeted when any setting is given), for each protocol of
    :func:`protocols_to_render` (the official one into ``<folder>/protocol_official``, its
    captions saying so); ``echo`` gets the opening line, the target and one count line per table
    and figure (only those named in ``only``, when given). Returns the files."""
    runs = ResultsStore(results).load(latest_per_config=True)
    echo(describe_rows(runs, results))
    written: list[Path] = []
    for name in protocols_to_render(runs, protocol):
        target = resolve_target(runs, model, calibration, eval, protocol=name)
        folder = out_folder(out, target)
        if target.retargeted:
            echo(f"target: {target.describe()}")
            echo(f"writing to {folder} (retargeted; the paper's own tables in {out} are left as they are)")
        else:
            echo(f"writing to {folder} (the paper's settings)")
        files = write_paper_tables(results, folder, runs, target, echo=echo, only=only)
        files += write_paper_figures(runs, folder, target, echo=echo, only=only)
        echo(f"wrote {len(files)} files to {folder}")
        written += files
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default="results/paper_tables")
    parser.add_argument("--model", default=None, help="render from runs of this model (conf/model name)")
    parser.add_argument("--calibration", default=None, help="... of this calibration set (default: inferred)")
    parser.add_argument("--eval", default=None, help="... of this eval suite (default: inferred)")
    parser.add_argument(
        "--protocol",
        default=None,
        choices=["paper", "official"],
        help="only the runs of this protocol (default: paper, and official where such runs exist)",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated names of the tables and figures to render (default: all), e.g. methods_equal_compression",
    )
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else None
    known = {spec.name for spec in TABLES} | set(FIGURES)
    if only is not None and (unknown := sorted(set(only) - known)):
        names = ", ".join(sorted(known))
        parser.error(f"--only={args.only!r}: no table or figure named {', '.join(unknown)} (known: {names})")
    render(
        args.results,
        args.out,
        args.model or None,
        args.calibration or None,
        args.eval or None,
        protocol=args.protocol or None,
        only=only,
    )


if __name__ == "__main__":
    main()
