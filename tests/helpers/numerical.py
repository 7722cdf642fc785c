"""What the unit and integration tests of numerical share: fixtures, builders and constants."""

from __future__ import annotations

import torch


CUT = (2, 4)


CPU = torch.device("cpu")
