"""What ``n_prune`` means in blocks: the one rounding rule that the selection, the rules, the methods and
the reports' "25% of the depth" conditions share."""

from __future__ import annotations

from replaceme_exp.errors import ConfigError


def blocks_to_prune(n_prune: int | float, num_layers: int) -> int:
    """``n_prune`` as a number of blocks: an integer as given, a fraction in (0, 1) of the
    model's depth rounded to the nearest block (``n_prune=0.25`` on 32 blocks -> 8)."""
    if isinstance(n_prune, float) and 0 < n_prune < 1:
        blocks = round(n_prune * num_layers)
        if blocks < 1:
            raise ConfigError("n_prune", n_prune, f"is less than one of the model's {num_layers} blocks")
        return blocks
    if isinstance(n_prune, bool) or not isinstance(n_prune, int) or n_prune < 1:
        raise ConfigError("n_prune", n_prune, "must be a positive integer (blocks) or a fraction in (0, 1) of them")
    return n_prune
