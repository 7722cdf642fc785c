"""LLM-Streamline (docs/methods/llm-streamline.md): the cut replaced by a lightweight network trained
on the calibration data, an FFN after the block before it or the cut's first block retrained
(``objective=streamline_ffn`` / ``streamline_layer``, ``experiment=llm_streamline`` / ``llm_streamline_layer``)."""

from replaceme_exp.estimation.streamline import StreamlineEstimator
from replaceme_exp.methods.plugin import Method, register

LABELS = {"ffn": "LLM-Streamline (FFN)", "layer": "LLM-Streamline (layer)"}

register(
    Method(
        "llm_streamline",
        docs="llm-streamline.md",
        label=lambda job: LABELS[job.config.objective.replacement],
        estimators=(StreamlineEstimator,),
        presets=("llm_streamline", "llm_streamline_layer"),
    )
)
