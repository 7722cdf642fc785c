"""SLEB (docs/methods/sleb.md): a search of its own chooses the blocks it removes
(replaceme_exp/selection/sleb.py, ``selection=sleb``, ``experiment=sleb``)."""

from replaceme_exp.methods.plugin import Method, register

register(
    Method(
        "sleb",
        docs="sleb.md",
        label=lambda job: "SLEB",
        selections=("sleb",),
        search_label="SLEB",
        presets=("sleb",),
    )
)
