"""Greedy answers to a few fixed prompts, rendered with the model's chat template: what the
unpruned and the pruned model say, side by side in the job's summary (``eval.samples``), or what
the one model of an evaluate job says."""

from __future__ import annotations

import torch

from replaceme_exp.data.sources import render_prompts
from replaceme_exp.progress import progress_counter, token_steps


@torch.no_grad()
def greedy_answers(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The model's greedy continuation of each rendered prompt (KV cache; one prompt at a time, so
    no padding can move an answer), decoded without special tokens and stripped; returns one
    string per prompt. Progress: tokens generated, counted at each decoding step."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    answers = []
    try:
        with progress_counter(len(prompts) * int(max_new_tokens), "generation samples", "token") as counter:
            for text in render_prompts(tokenizer, prompts):
                ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids.to(device)
                steps = token_steps(counter, 1)
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=int(max_new_tokens),
                    do_sample=False,
                    num_beams=1,
                    pad_token_id=pad,
                    use_cache=True,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    stopping_criteria=[steps],
                )
                counter.update(int(max_new_tokens) - steps.steps)  # an answer that ended early
                answers.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip())
    finally:
        model.train(was_training)
    return answers


def side_by_side(prompts: list[str], unpruned: list[str], pruned: list[str]) -> list[dict]:
    """``[{"prompt", "unpruned", "pruned"}, ...]`` (the row's ``generation_samples``)."""
    return [{"prompt": p, "unpruned": u, "pruned": q} for p, u, q in zip(prompts, unpruned, pruned)]


def answers_alone(prompts: list[str], answers: list[str]) -> list[dict]:
    """``[{"prompt", "answer"}, ...]`` (an evaluate job's ``generation_samples``: one model)."""
    return [{"prompt": p, "answer": a} for p, a in zip(prompts, answers)]
