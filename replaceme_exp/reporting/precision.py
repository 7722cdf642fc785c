"""Numbers to the precision they have: a value with a standard error is rounded to the error's
leading digits (``0.4821 ± 0.0667`` on 56 items is ``0.48 ± 0.07``, not ``0.4821``); a value
without one keeps a few significant digits, since the report cannot know more (a perplexity has no
standard error unless one is computed: none is invented).

The rule for the error: two significant digits when its leading digits are below 35 (``0.012``,
``0.34``), else one (``0.07``, ``0.5``), the Particle Data Group's convention; the value is then
rounded to the error's last digit.
"""

from __future__ import annotations

import math

SIGNIFICANT_WITHOUT_ERROR = 4


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def error_decimals(stderr: float) -> int:
    """The decimal position (as ``round``'s ``ndigits``) of ``stderr``'s last significant digit:
    two digits when its leading two are below 35, else one."""
    exponent = math.floor(math.log10(stderr))
    leading = stderr / 10 ** (exponent - 1)  # 10.0 <= leading < 100
    digits = 2 if round(leading) < 35 else 1
    return digits - 1 - exponent


def format_measure(value, stderr=None, significant: int = SIGNIFICANT_WITHOUT_ERROR) -> str:
    """``value ± stderr`` rounded to the error (:func:`error_decimals`), or ``value`` alone to
    ``significant`` digits when there is no usable error; ``—`` for no value."""
    if not _finite(value):
        return "—"
    if _finite(stderr) and stderr > 0:
        decimals = error_decimals(float(stderr))
        shown = max(decimals, 0)
        rounded_error = round(float(stderr), decimals)
        return f"{round(float(value), decimals):.{shown}f} ± {rounded_error:.{shown}f}"
    return format_number(value, significant)


def format_number(value, significant: int = SIGNIFICANT_WITHOUT_ERROR) -> str:
    """``value`` to ``significant`` digits (integers as they are); ``—`` for no value."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if not _finite(value):
        return "—"
    if float(value).is_integer() and abs(value) < 10**significant:
        return str(int(value))
    if abs(value) >= 10**significant:  # 50342.7 -> 50343, not 5.034e+04
        return f"{float(value):.0f}"
    return f"{float(value):.{significant}g}"
