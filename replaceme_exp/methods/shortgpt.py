"""ShortGPT (Men et al. 2024, *ShortGPT: Layers in Large Language Models are More Redundant Than You
Expect*; docs/methods/shortgpt.md): the ``n`` blocks of lowest Block Influence removed, nothing
fitted (``experiment=shortgpt``); its search is replaceme_exp/selection/shortgpt.py."""

from replaceme_exp.config.schema import Group, SelectionConfig, key, positive_int, register_shape
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.selection.metrics import METRICS, SelectionMetric
from replaceme_exp.selection.shortgpt import shortgpt_search


@register_shape("selection")
@Group
class ShortGptSelectionConfig(SelectionConfig):
    """``selection=shortgpt``: the Block Influence of every block, its official code's reading."""

    window: int = key(
        256, doc="each sequence runs in windows of this many tokens (the official stride)", check=positive_int
    )
    final_norm: bool = key(
        True, doc="the last block's output after the model's final norm, as the official code reads it"
    )


METRICS.register(
    "shortgpt",
    SelectionMetric(
        "shortgpt", "search", search=shortgpt_search, settings=ShortGptSelectionConfig, fits_after=True, text_only=True
    ),
)
register(
    Method(
        "shortgpt",
        title="ShortGPT",
        docs="shortgpt.md",
        label=lambda job: "ShortGPT",
        selections=("shortgpt",),
        search_label="ShortGPT",
        presets=("shortgpt",),
        column_docs={
            "selection_window": "ShortGPT (`selection=shortgpt`): the windows of tokens each sequence runs in (its "
            "official stride, 256); None for other selections.",
            "selection_final_norm": "ShortGPT: whether the last block's output is read after the model's final norm "
            "(its official code, `true`) or as the block returns it; None for other selections.",
            "shortgpt_block_influence": "ShortGPT: JSON, every block's Block Influence `1 - mean cos(X_i, X_{i+1})` "
            "over "
            "the calibration tokens, by block.",
            "shortgpt_order": "ShortGPT: JSON, the blocks by ascending Block Influence (the first `n_prune` are "
            "removed).",
            "shortgpt_tokens": "ShortGPT: the calibration tokens the Block Influence averages over.",
        },
    )
)
