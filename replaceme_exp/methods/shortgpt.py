"""ShortGPT (docs/methods/shortgpt.md): a search of its own chooses the blocks it removes
(replaceme_exp/selection/shortgpt.py, ``selection=shortgpt``, ``experiment=shortgpt``)."""

from replaceme_exp.methods.plugin import Method, register

register(
    Method(
        "shortgpt",
        docs="shortgpt.md",
        label=lambda job: "ShortGPT",
        selections=("shortgpt",),
        search_label="ShortGPT",
        presets=("shortgpt",),
    )
)
