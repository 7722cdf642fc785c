"""LaCo (docs/methods/laco.md): a search of its own chooses the blocks it removes
(replaceme_exp/selection/laco.py, ``selection=laco``, ``experiment=laco``)."""

from replaceme_exp.methods.plugin import Method, register

register(
    Method(
        "laco",
        docs="laco.md",
        label=lambda job: "LaCo",
        selections=("laco",),
        search_label="LaCo",
        presets=("laco",),
    )
)
