"""The marks of a row made with another library version than its protocol's: a protocol that names one
(``protocol=official``: lm-eval 0.4.8, the official code's pin; transformers 4.46.3; torchmin 0.0.2)
records it in ``<library>_version_protocol``, and a row made with another installed version has
``<library>_off_protocol`` true. Tables print such a row's label with the library's mark and explain
each mark once."""

from __future__ import annotations

import numpy as np
import pandas as pd

# column prefix -> (the mark's name, what the protocol names and why it can move numbers)
LIBRARIES = {
    "lm_eval": (
        "lm-eval",
        "scored with an lm-eval version other than the one its protocol names (protocol=official: 0.4.8, the "
        "official code's pin; the row's lm_eval_version says which); scores can move with the version",
    ),
    "transformers": (
        "transformers",
        "run with a transformers version other than the one its protocol names (protocol=official: 4.46.3, the "
        "official code's pin; the row's transformers_version says which); kernels and defaults can move numbers",
    ),
    "torchmin": (
        "torchmin",
        "fitted with a torchmin version other than the one its protocol names (protocol=official: 0.0.2, what "
        "the official code installed); 0.1.0 drops some one-step changes that 0.0.2 keeps",
    ),
}


def mark(library: str) -> str:
    return f"({LIBRARIES[library][0]}≠)"


def note(library: str) -> str:
    return f"{mark(library)}: {LIBRARIES[library][1]}."


MARK, NOTE = mark("lm_eval"), note("lm_eval")


def off_protocol(runs: pd.DataFrame) -> list[str]:
    """The libraries (column prefixes, in :data:`LIBRARIES`' order) for which any of ``runs`` has
    ``<library>_off_protocol`` true (a row written before the column existed counts as not known, unmarked)."""
    out = []
    for library in LIBRARIES:
        column = f"{library}_off_protocol"
        if column in runs.columns and runs[column].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v)).any():
            out.append(library)
    return out


def any_off_protocol(runs: pd.DataFrame) -> bool:
    """Whether any of ``runs`` was scored with another lm-eval than its protocol's."""
    return "lm_eval" in off_protocol(runs)
