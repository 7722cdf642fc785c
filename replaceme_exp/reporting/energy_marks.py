"""The "estimated" mark of energy and CO2 numbers: CodeCarbon estimates a device's power where it
cannot read a counter (the CPU from its TDP and load, the RAM from its size), and a row says so in
``energy_estimated`` (:mod:`replaceme_exp.tracking.emissions`). Tables and reports print such a
number as ``0.0012 (est.)`` and explain the mark once."""

from __future__ import annotations

import numpy as np
import pandas as pd

MARK = "(est.)"
NOTE = (
    f"{MARK}: energy and CO2 estimated by CodeCarbon (CPU from its TDP and load, RAM from its size), "
    "not measured by a power counter; the row's energy_power says how, per device."
)
ENERGY_PREFIXES = ("energy_kwh", "co2_kg")


def is_energy_metric(column: str) -> bool:
    """Whether ``column`` holds an energy or CO2 number (``energy_kwh``, ``co2_kg_capture``, ...)."""
    return column.startswith(ENERGY_PREFIXES)


def _true(value) -> bool:
    return isinstance(value, (bool, np.bool_)) and bool(value)


def any_estimated(runs: pd.DataFrame | pd.Series | dict) -> bool:
    """Whether any of ``runs`` (a frame of rows, or one row) has ``energy_estimated`` true (a row
    written before the column existed counts as not known, unmarked)."""
    if isinstance(runs, pd.DataFrame):
        return "energy_estimated" in runs.columns and bool(runs["energy_estimated"].map(_true).any())
    return _true(runs.get("energy_estimated"))


def marked(text: str, estimated: bool) -> str:
    """``text`` with the mark when ``estimated`` (a missing number stays unmarked)."""
    return f"{text} {MARK}" if estimated and text not in ("—", "--", "") else text
