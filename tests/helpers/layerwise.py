"""What the unit and integration tests of layerwise share: fixtures, builders and constants."""

from __future__ import annotations

import torch

from replaceme_exp.capture.execution import CaptureExecution


CPU = torch.device("cpu")


def layerwise(**kwargs) -> CaptureExecution:
    return CaptureExecution(mode="layerwise", device=CPU, **kwargs)
