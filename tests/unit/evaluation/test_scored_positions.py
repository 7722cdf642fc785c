"""lm-eval's requests scored with the LM head on the scored positions only give what lm-eval's own
HFLM gives over every position, on random tiny models of two families."""

from __future__ import annotations

import random

import pytest
from helpers.models import tiny_model

from replaceme_exp.evaluation.scored_positions import kept_positions, request_input, row_lengths


def test_a_row_is_placed_only_when_exactly_one_request_fits_it():
    scored = {(5, 6, 7): 2, (5, 6): 1, (5,): 1}
    assert row_lengths([5, 6, 7], scored) == (3, 2)
    assert row_lengths([5, 6, 7, 0, 0], scored) == (3, 2)  # right padding
    assert row_lengths([9, 9], scored) is None
    # [5, 0] is the input [5, 0] or the input [5] padded: both are requests, so neither is assumed
    assert row_lengths([5, 0], {(5, 0): 1, (5,): 1}) is None
    assert row_lengths([5, 0], {(5, 0): 1}) == (2, 1)


def test_kept_positions_end_at_each_rows_input_and_never_go_below_zero():
    assert kept_positions([(5, 2), (3, 1), (1, 1)]).tolist() == [[3, 4], [1, 2], [0, 0]]


def test_the_request_input_drops_the_last_token_and_keeps_the_last_max_length():
    assert request_input([1, 2, 3], [4, 5], max_length=8) == (1, 2, 3, 4)
    assert request_input([1, 2, 3], [4, 5], max_length=3) == (2, 3, 4)


def requests(seed: int = 0, vocab: int = 128) -> list:
    """lm-eval loglikelihood requests ((context, continuation) strings, context ids, continuation
    ids): several lengths, contexts longer than max_length, one-token continuations of a shared
    context, two requests with one input and different continuations, and a pair whose rows only
    differ by trailing padding (ids 0)."""
    rng = random.Random(seed)
    out = []

    def add(ctx, cont):
        out.append(((f"c{len(out)}", f"x{len(out)}"), ctx, cont))

    for _ in range(24):
        add([rng.randrange(1, vocab) for _ in range(rng.randrange(1, 48))],
            [rng.randrange(1, vocab) for _ in range(rng.randrange(1, 7))])
    shared = [rng.randrange(1, vocab) for _ in range(12)]
    for token in (3, 4, 5, 6):
        add(shared, [token])
    add([7, 8], [9])
    add([7], [8, 9])
    add([5, 0], [0])
    add([5], [7])
    return out


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_scores_match_lm_evals_own_over_fewer_head_positions(family, smollm2_tokenizer):
    from lm_eval.models.huggingface import HFLM

    from replaceme_exp.evaluation.harness import progress_lm_class

    overrides = {"final_logit_softcapping": 30.0} if family == "gemma3_text" else {}
    model = tiny_model(family, num_layers=2, vocab=128, max_position_embeddings=64, **overrides)
    head_rows = []
    model.get_output_embeddings().register_forward_hook(lambda m, i, o: head_rows.append(i[0].shape[:-1].numel()))
    reqs = requests()

    def scores(cls):
        head_rows.clear()
        lm = cls(pretrained=model, tokenizer=smollm2_tokenizer, batch_size=4, max_length=32)
        return lm._loglikelihood_tokens(reqs, disable_tqdm=True), sum(head_rows)

    (expected, all_rows), (got, kept_rows) = scores(HFLM), scores(progress_lm_class())
    assert [g for _, g in got] == [g for _, g in expected]
    assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in expected], rel=1e-5, abs=1e-5)
    assert kept_rows < all_rows / 3, (kept_rows, all_rows)


def test_rolling_windows_score_every_position_as_lm_eval_does(smollm2_tokenizer):
    """loglikelihood_rolling's windows predict each of their tokens: the same sums either way."""
    from lm_eval.models.huggingface import HFLM

    from replaceme_exp.evaluation.harness import progress_lm_class

    model = tiny_model("llama", num_layers=2, vocab=128, max_position_embeddings=64)
    rng = random.Random(1)
    reqs = [((None, None), [1], [rng.randrange(1, 128) for _ in range(n)]) for n in (5, 17, 32)]
    expected = HFLM(pretrained=model, tokenizer=smollm2_tokenizer, batch_size=2, max_length=32)
    got = progress_lm_class()(pretrained=model, tokenizer=smollm2_tokenizer, batch_size=2, max_length=32)
    a = expected._loglikelihood_tokens(reqs, disable_tqdm=True)
    b = got._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert [x for x, _ in b] == pytest.approx([x for x, _ in a], rel=1e-5)
