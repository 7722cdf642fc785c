"""What the unit, integration and e2e tests of first run share: fixtures, builders and constants."""

from __future__ import annotations

import os
import time

from replaceme_exp.data.sources import render_prompts


def brute_force_answers(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int) -> list[str]:
    """Greedy answers by plain ``model.generate`` calls on left-padded batches of ``batch_size``
    consecutive prompts (written out here, not the project's generation code)."""
    answers = []
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        for start in range(0, len(prompts), batch_size):
            texts = render_prompts(tokenizer, prompts[start : start + batch_size])
            batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)  # fmt: skip
            decoded = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
            answers += [a.strip() for a in decoded]
    finally:
        tokenizer.padding_side = side
    return answers


ENV = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")


def wait_for(proc, stream_lines: list[str], text: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not any(text in line for line in stream_lines) and time.time() < deadline:
        assert proc.poll() is None, stream_lines
        time.sleep(0.05)
    assert any(text in line for line in stream_lines), stream_lines


def reader(proc) -> list[str]:
    import threading

    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    return lines
