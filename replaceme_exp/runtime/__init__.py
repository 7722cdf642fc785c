"""The runtime around a job: the row it always leaves (:mod:`.runner`), one job per configuration at
a time (:mod:`.locks`), stop signals (:mod:`.signals`), the summaries a person reads at the end of
a job and of a sweep, and Hydra's callbacks."""

from replaceme_exp.runtime.runner import run_recorded
from replaceme_exp.runtime.signals import JobInterrupted

__all__ = ["JobInterrupted", "run_recorded"]
