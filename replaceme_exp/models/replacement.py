"""The lightweight network LLM-Streamline puts in place of a cut (Chen et al., ICLR 2025): an FFN
``fc2(relu(fc1(x)))``, ``d -> expansion * d -> d`` with biases, no residual and no norm (the
authors' ``MLP`` of examples/mlp_mseloss_train_without_memory_issue/modeling_llama.py). Its output
replaces the hidden states at the cut: it maps the cut's input to the cut's output."""

from __future__ import annotations

import torch
from torch import nn


class ReplacementFFN(nn.Module):
    """``x`` (..., d) -> ``fc2(relu(fc1(x)))`` (..., d); ``fc1``: (expansion * d, d), ``fc2``:
    (d, expansion * d), both with bias. ``init_std``: weights drawn from N(0, init_std) and zero
    biases, as the authors' model class initialises it (``LlamaPreTrainedModel._init_weights`` with
    the model's ``initializer_range``, run by ``post_init`` over every module, their ``MLP`` too);
    None: PyTorch's ``nn.Linear`` default (Kaiming-uniform weights, uniform biases)."""

    def __init__(self, hidden_size: int, expansion: int = 4, init_std: float | None = None):
        super().__init__()
        self.fc1 = nn.Linear(hidden_size, expansion * hidden_size)
        self.fc2 = nn.Linear(expansion * hidden_size, hidden_size)
        if init_std is not None:
            for linear in (self.fc1, self.fc2):
                nn.init.normal_(linear.weight, mean=0.0, std=init_std)
                nn.init.zeros_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> "ReplacementFFN":
        """The FFN whose parameters are ``state`` (``fc1.weight``, ``fc1.bias``, ``fc2.weight``,
        ``fc2.bias``), its sizes read from their shapes, in their dtype."""
        inner, hidden = state["fc1.weight"].shape
        if inner % hidden:
            raise ValueError(f"an FFN of {hidden} -> {inner}: its width is no multiple of {hidden}")
        network = cls(hidden, inner // hidden).to(state["fc1.weight"].dtype)
        network.load_state_dict(state)
        return network
