"""What the unit and e2e tests of offline tasks share: fixtures, builders and constants."""

from __future__ import annotations

import json

from replaceme_exp.evaluation.harness import OFFLINE_TASKS


MANIFEST = json.loads((OFFLINE_TASKS / "offline_items.json").read_text())


TASKS = ("replaceme_world_mc", "replaceme_doc_cloze", "replaceme_doc_pairs")


def shipped(task: str) -> list[dict]:
    path = OFFLINE_TASKS / MANIFEST["tasks"][task]["file"]
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def loglikelihood(model, tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """log p(continuation | context) and whether it is the greedy continuation, token by token, as
    lm-eval's causal models encode a pair: an empty context is the prefix token (BOS, else EOS);
    otherwise the context's trailing spaces move to the continuation and the continuation's tokens
    are those of the whole text after the context's."""
    import torch

    def encode(s):
        return tokenizer.encode(s, add_special_tokens=False)
    if context == "":
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        ctx, cont = [prefix], encode(continuation)
    else:
        stripped = context.rstrip()
        continuation = context[len(stripped) :] + continuation
        ctx = encode(stripped)
        cont = encode(stripped + continuation)[len(ctx) :]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logits = model(ids).logits[0, len(ctx) - 1 : -1].log_softmax(-1)
    target = torch.tensor(cont)
    return float(logits[torch.arange(len(cont)), target].sum()), bool((logits.argmax(-1) == target).all())
