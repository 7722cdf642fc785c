"""The mark of a row scored with another lm-eval version than its protocol's: a protocol that names one
(``protocol=official``: 0.4.8, the official code's pin) records it in ``lm_eval_version_protocol``, and
a row scored with another installed version has ``lm_eval_off_protocol`` true. Tables print such a
row's label with :data:`MARK` and explain it once."""

from __future__ import annotations

import numpy as np
import pandas as pd

MARK = "(lm-eval≠)"
NOTE = (
    f"{MARK}: scored with an lm-eval version other than the one its protocol names (protocol=official: 0.4.8, "
    "the official code's pin; the row's lm_eval_version says which); scores can move with the version."
)


def any_off_protocol(runs: pd.DataFrame) -> bool:
    """Whether any of ``runs`` has ``lm_eval_off_protocol`` true (a row written before the column
    existed counts as not known, unmarked)."""
    if "lm_eval_off_protocol" not in runs.columns:
        return False
    return bool(runs["lm_eval_off_protocol"].map(lambda v: isinstance(v, (bool, np.bool_)) and bool(v)).any())
