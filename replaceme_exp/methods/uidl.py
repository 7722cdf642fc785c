"""The blocks removed and nothing fitted (``objective=identity``): UIDL (Gromov et al., "The
Unreasonable Ineffectiveness of the Deeper Layers") where the angular distance of each sequence's
last token chose the cut (``experiment=uidl_baseline``), block removal on a cut chosen otherwise or
given, and the peer searches' own removals (ShortGPT, SLEB, LaCo: named by the search):
docs/methods/uidl.md."""

from replaceme_exp.estimation.estimators import IdentityEstimator
from replaceme_exp.methods.plugin import Labelled, Method, register


def removal_label(job: Labelled) -> str:
    if job.search is not None:
        return job.search.search_label
    return "UIDL" if job.selection_metric == "angular_last" else "block removal"


register(
    Method(
        "uidl",
        title="UIDL and block removal",
        docs="uidl.md",
        label=removal_label,
        estimators=(IdentityEstimator,),
        follows_protocol=True,
        official_4bit_evaluation=True,
        presets=("uidl_baseline", "uidl_healed", "uidl_official"),
    )
)
