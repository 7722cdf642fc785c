"""Merging the parameters of consecutive blocks into one (LaCo's layer merge, Yang et al. 2024).

A block's merged parameters are those of its attention and MLP sub-modules
(:attr:`~replaceme_exp.models.adapters.DecoderAdapter.merged_modules`): LaCo merges "the
parameters of SAN and MLP"; the official code merges the seven projection weights of a Llama
block and keeps the base block's norms, as this module does (biases and per-head norms inside the
attention, where a family has them, are merged with the rest)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Literal

import torch
from torch import nn

BlockState = dict[str, torch.Tensor]  # {parameter name inside the block: value}
MergeRule = Literal["rdsc", "official_code"]


def mergeable_state(block: nn.Module, modules: tuple[str, ...]) -> BlockState:
    """The parameters of ``block`` that a merge changes (those under one of ``modules``), detached
    copies by name."""
    prefixes = tuple(f"{m}." for m in modules)
    return {name: p.detach().clone() for name, p in block.named_parameters() if name.startswith(prefixes)}


def rdsc_merge(base: BlockState, later: list[BlockState]) -> BlockState:
    """Reserving-Differences-while-Seeking-Common (LaCo, Eq. 1): ``theta*_l = theta_l +
    sum_{k=1..m} (theta_{l+k} - theta_l)`` for every parameter of ``base``; ``later``: the states of
    blocks ``l+1 .. l+m`` (same names and shapes; on any device: summed on the base's). Summed in
    float32 at least (float64 stays), returned in each parameter's dtype."""
    merged = {}
    for name, value in base.items():
        work = torch.promote_types(value.dtype, torch.float32)
        theta = value.to(work)
        total = theta.clone()
        for state in later:
            total += state[name].to(device=theta.device, dtype=work) - theta
        merged[name] = total.to(value.dtype)
    return merged


def official_code_merge(base: BlockState, later: list[BlockState]) -> BlockState:
    """What the official notebooks compute (``laco_llama-13b.ipynb``): the base block is updated in
    place, ``theta <- theta + (theta_{l+k} - theta)`` for k = 1..m, each difference taken from the
    already updated base, which leaves ``theta_{l+m}``: the last merged block's weights on the base
    block's norms (reported upstream as issues 4 and 5 of yangyifei729/LaCo)."""
    if not later:
        return {name: value.clone() for name, value in base.items()}
    return {name: later[-1][name].clone() for name in base}


MERGES = {"rdsc": rdsc_merge, "official_code": official_code_merge}


def merge_states(rule: MergeRule, base: BlockState, later: list[BlockState]) -> BlockState:
    """``base`` merged with ``later`` by ``rule`` (``rdsc``: the paper's Eq. 1; ``official_code``: the notebooks')."""
    return MERGES[rule](base, later)


@contextmanager
def parameters_set(blocks: nn.ModuleList, states: dict[int, BlockState]) -> Iterator[None]:
    """``blocks[i]`` with the parameter values ``states[i]`` inside the block, their own values
    (bit for bit) afterwards."""
    saved: dict[int, BlockState] = {}
    try:
        with torch.no_grad():
            for index, state in states.items():
                parameters = dict(blocks[index].named_parameters())
                saved[index] = {name: parameters[name].detach().clone() for name in state}
                for name, value in state.items():
                    parameters[name].copy_(value)
        yield
    finally:
        with torch.no_grad():
            for index, state in saved.items():
                parameters = dict(blocks[index].named_parameters())
                for name, value in state.items():
                    parameters[name].copy_(value)
