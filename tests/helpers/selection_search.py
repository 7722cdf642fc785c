"""What the unit and integration tests of selection search share: fixtures, builders and constants."""

from __future__ import annotations

import pytest

from replaceme_exp.methods import METHODS, Method
from replaceme_exp.selection.metrics import METRICS, SelectionMetric
from replaceme_exp.selection.search import SearchContext, SearchResult


SCALE = 0.5  # the toy search's new weight: block 1's down-projection scaled


def toy_search(context: SearchContext) -> SearchResult:
    """Removes block 0 and the last ``n_blocks - 1`` blocks; halves block 1's down-projection. It
    runs the model once with its blocks taken out, as a real search would, and records that pass's
    depth (the model it was given must be whole again afterwards)."""
    adapter = context.adapter
    num_layers = adapter.num_layers
    removed = [0, *range(num_layers - context.n_blocks + 1, num_layers)]
    with adapter.without_blocks(removed):
        depth_inside = adapter.num_layers
        batch = next(iter(context.calibration))
        adapter.forward_batch(batch, adapter.embeddings.weight.device)
    down = adapter.layers[1].mlp.down_proj.weight.detach().clone()
    return SearchResult(removed, {1: {"mlp.down_proj.weight": down * SCALE}}, {"toy_depth_inside": depth_inside})


@pytest.fixture
def toy_metric():
    METRICS.register("toy_search", SelectionMetric("toy_search", "search", search=toy_search))
    METHODS.register(
        "toy",
        Method(
            "toy", title="Toy", docs="toy.md", label=lambda job: "Toy", selections=("toy_search",), search_label="Toy"
        ),
    )
    yield "toy_search"
    METRICS._entries.pop("toy_search")
    METHODS.remove("toy")
