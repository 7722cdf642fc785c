"""LLM-Streamline (docs/methods/llm-streamline.md): the cut replaced by a lightweight network trained
on the calibration data, an FFN after the block before it or the cut's first block retrained
(``objective=streamline_ffn`` / ``streamline_layer``, ``experiment=llm_streamline`` / ``llm_streamline_layer``)."""

from replaceme_exp.config import schema
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.streamline import StreamlineEstimator
from replaceme_exp.methods.plugin import Method, register
from replaceme_exp.models.shape import ModelShape
from replaceme_exp.selection.cuts import cut_length
from replaceme_exp.selection.metrics import METRICS

LABELS = {"ffn": "LLM-Streamline (FFN)", "layer": "LLM-Streamline (layer)"}


def retrained_block_fits(config: schema.JobConfig, shape: ModelShape) -> None:
    """The layer variant selects a cut one block longer than it removes: it fits the model."""
    if (
        config.objective.replacement != "layer"
        or config.cuts is not None
        or METRICS.get(config.selection.metric).searches
    ):
        return
    if cut_length(config.n_prune, config.num_lts, shape.num_layers) + 1 > shape.num_layers - 1:
        reason = f"objective={config.objective.name} retrains one block of a cut of n_prune + 1 blocks: "
        raise ConfigError("n_prune", config.n_prune, reason + f"at most {shape.num_layers - 2} here")


register(
    Method(
        "llm_streamline",
        docs="llm-streamline.md",
        label=lambda job: LABELS[job.config.objective.replacement],
        estimators=(StreamlineEstimator,),
        presets=("llm_streamline", "llm_streamline_layer"),
        check_shape=retrained_block_fits,
    )
)
