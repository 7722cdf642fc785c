"""Self-generated chat calibration data: prompts answered by the model being pruned, each prompt
and answer rendered as a user/assistant chat in the model's chat template (the paper's
"orca_generated": the model's own answers to SlimOrca's instruction prompts).

The prompts come from a dataset (``calibration.prompts_dataset``: SlimOrca from the hub for the
paper's row, or a local JSONL file in the same format) or from a prompt list.

Offline, the prompts ship with the project (``prompts/instructions.jsonl``: 256 general
instructions, none about capitals, opposites or the demo prompts of ``eval.samples``); a JSONL
file with a ``prompt`` field, or a text file with one prompt per line, can replace them. Answers
are generated in batches with a KV cache (greedy, or seeded sampling) and cached by content (the
model's identity, the prompts and every generation setting), so a sweep generates once. A cached set
carries that key and a checksum (:func:`~replaceme_exp.storage.write_keyed_json`) and must hold one
answer per prompt asked for: anything else is reported, removed and generated again.
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import torch

from replaceme_exp.data import files
from replaceme_exp.data.files import JsonRecords, TextFile
from replaceme_exp.data.hub import HubDataset
from replaceme_exp.data.sources import dataset_records, first_user_turn, render_prompts, render_record
from replaceme_exp.errors import ConfigError
from replaceme_exp.progress import progress
from replaceme_exp.samples import publish
from replaceme_exp.storage import (
    content_key,
    discard_entry,
    read_keyed_json,
    remove_dead_temporaries,
    write_keyed_json,
    write_optional,
)

log = logging.getLogger(__name__)

SHIPPED_PROMPTS = Path(__file__).with_name("prompts") / "instructions.jsonl"


def prompt_pool(path: str | None, limit: int | None = None) -> tuple[list[str], bool]:
    """The prompts of ``path`` (see :func:`load_prompts`) in its first ``limit`` bytes (None: all),
    and whether that was the whole file. Every line is checked as
    :class:`~replaceme_exp.data.files.TextFile` / :class:`~replaceme_exp.data.files.JsonRecords`
    check it: one error naming ``calibration.prompts_path``, the file and the line."""
    key = "calibration.prompts_path"
    file = SHIPPED_PROMPTS if not path else Path(path).expanduser()
    value = path or str(file)
    if file.suffix == ".jsonl":
        records = JsonRecords(key, value, file, limit)
        prompts = []
        for where, record in records.records():
            if record.get("prompt") is None:
                reason = f"{where}: no JSON prompt (no 'prompt' field; its keys: {sorted(record)})"
                raise ConfigError(key, value, reason)
            prompts.append(str(record["prompt"]))
        return prompts, records.complete
    text = TextFile(key, value, file, limit)
    lines = [line.strip() for _, line in text.lines()]
    prompts = [line for line in lines if line]
    if not prompts and text.complete:
        raise ConfigError(key, value, "holds no text" + ("" if lines else " (the file is empty)"))
    return prompts, text.complete


def load_prompts(path: str | None) -> list[str]:
    """The prompt pool: the shipped instructions (``path`` null), a JSONL file (``prompt`` field)
    or a text file (one prompt per line)."""
    return prompt_pool(path)[0]


def check_prompts(cfg, key: str, n_samples: int | None) -> None:
    """Before the model loads: the prompts file (``prompts_path``), or the local prompt records
    (``prompts_dataset: json``), checked in their first
    :data:`~replaceme_exp.data.files.PREFLIGHT_BYTES`; read whole, they hold ``n_samples`` prompts."""
    if getattr(cfg, "prompts_dataset", None):
        if cfg.prompts_dataset != "json":
            return
        paths = cfg.prompts_data_files if isinstance(cfg.prompts_data_files, list) else [cfg.prompts_data_files]
        count, complete = 0, True
        for file in paths:
            records = JsonRecords(f"{key}.prompts_data_files", file, str(file), files.PREFLIGHT_BYTES)
            for where, record in records.records():
                try:
                    first_user_turn(record, cfg.prompts_chat_field, cfg.prompts_text_field, f"{key}.prompts_chat_field")
                except ConfigError as err:
                    raise ConfigError(err.key, err.value, f"{where} of {file}: {err.reason}") from err
                count += 1
            complete = complete and records.complete
        if complete and n_samples is not None and count < n_samples:
            reason = f"the prompt dataset gave only {count} records; lower n_samples"
            raise ConfigError("calibration.n_samples", n_samples, reason)
        return
    if cfg.prompts_path is None:
        return
    prompts, complete = prompt_pool(cfg.prompts_path, files.PREFLIGHT_BYTES)
    if complete and n_samples is not None and len(prompts) < n_samples:
        chosen_prompts(prompts, n_samples, 0)  # its refusal


def prompts_hub_datasets(cfg, key: str) -> list[HubDataset]:
    dataset = getattr(cfg, "prompts_dataset", None)
    if not dataset or dataset == "json":
        return []
    instead = "use the shipped prompts (calibration=self_generated) or local ones (calibration.prompts_dataset=json)"
    return [HubDataset(f"{key}.prompts_dataset", dataset, dataset, cfg.prompts_subset, instead=instead)]


def dataset_prompts(cfg, n_samples: int, seed: int) -> list[str]:
    """``n_samples`` prompts from a dataset, drawn by ``seed``: the first user turn of each record's
    ``prompts_chat_field`` conversation (or its ``prompts_text_field``). ``prompts_dataset`` is a
    hub id (the paper's orca_generated: ``Open-Orca/SlimOrca``) or ``json`` with local
    ``prompts_data_files`` in the same format (offline)."""
    records = dataset_records(
        path=cfg.prompts_dataset,
        name=cfg.prompts_subset,
        split=cfg.prompts_split,
        data_files=cfg.prompts_data_files,
        n_records=n_samples,
        seed=seed,
        streaming=bool(cfg.streaming),
        key="calibration.prompts_data_files",
    )
    chat_field, text_field = cfg.prompts_chat_field, cfg.prompts_text_field
    prompts = [first_user_turn(r, chat_field, text_field, "calibration.prompts_chat_field") for r in records]
    if len(prompts) < n_samples:
        reason = f"the prompt dataset gave only {len(prompts)} records; lower n_samples"
        raise ConfigError("calibration.n_samples", n_samples, reason)
    return prompts


def chosen_prompts(pool: list[str], n_samples: int, seed: int) -> list[str]:
    """``n_samples`` prompts of the pool in a seeded order (refused when the pool is smaller)."""
    if len(pool) < n_samples:
        raise ConfigError(
            "calibration.n_samples", n_samples, f"the prompt pool holds only {len(pool)} prompts; lower n_samples"
        )
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    return [pool[i] for i in order[:n_samples]]


@torch.no_grad()
def generate_answers(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[str]:
    """One answer per prompt, in order: batches of ``batch_size`` left-padded rendered prompts
    through ``model.generate`` (KV cache), greedy when ``temperature`` is 0, else sampled from a
    seeded generator; returns the decoded answers without special tokens."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts = render_prompts(tokenizer, prompts)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    answers: list[str] = []
    torch.manual_seed(seed)
    try:
        starts = range(0, len(texts), batch_size)
        for start in progress(starts, desc="generating calibration answers", unit="batch"):
            batch = tokenizer(texts[start : start + batch_size], return_tensors="pt", padding=True,
                              add_special_tokens=False).to(device)  # fmt: skip
            sampling = {"do_sample": True, "temperature": temperature, "top_p": None, "top_k": None}
            greedy = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
            out = model.generate(
                **batch,
                max_new_tokens=int(max_new_tokens),
                num_beams=1,
                pad_token_id=pad,
                use_cache=True,
                **(sampling if temperature > 0 else greedy),
            )
            new = out[:, batch["input_ids"].shape[1] :]
            answers += [a.strip() for a in tokenizer.batch_decode(new, skip_special_tokens=True)]
    finally:
        tokenizer.padding_side = padding_side
    return answers


def generation_key(model_identity: str, prompts: list[str], cfg) -> dict:
    """Key of a generated set: the model's identity hash, the prompts and every setting that
    changes an answer (the cache file is named by its :func:`content_key`)."""
    return {
        "model": model_identity,
        "prompts": content_key(prompts),
        "max_new_tokens": int(cfg.max_new_tokens),
        "temperature": float(cfg.temperature),
        "seed": int(cfg.seed),
        "batch_size": int(cfg.generation_batch_size),  # padding can move a greedy answer
        "torch": torch.__version__,
    }


def cached_answers(path: Path, key: dict, prompts: list[str]) -> list[str] | None:
    """The answers cached at ``path`` for ``key``: one string per prompt of ``prompts``, stored
    with them; None (reported and removed when the entry is bad) otherwise."""
    entry = read_keyed_json(path, key, "generated calibration entry")
    if entry is None:
        return None
    entry = entry if isinstance(entry, dict) else {}
    answers = entry.get("answers")
    answers = answers if isinstance(answers, list) and all(isinstance(a, str) for a in answers) else []
    if entry.get("prompts") != prompts:
        problem = "holds other prompts than those asked for"
    elif len(answers) != len(prompts):
        problem = f"holds {len(answers)} answers for {len(prompts)} prompts"
    else:
        return answers
    discard_entry(path, "generated calibration entry", problem)
    return None


def self_generated_documents(cfg, tokenizer, model, model_identity: str, cache_dir: str | os.PathLike) -> list[str]:
    """``cfg.n_samples`` chats (prompt, the model's answer) in the chat template; the answers come
    from ``cache_dir/generated/<key>.json`` when this model already answered these prompts with
    these settings, else they are generated and cached (atomically)."""
    if model is None:
        raise ConfigError("calibration.source", "generated", "needs the model to answer its prompts")
    if getattr(cfg, "prompts_dataset", None):
        prompts = dataset_prompts(cfg, int(cfg.n_samples), int(cfg.seed))
    else:
        prompts = chosen_prompts(load_prompts(cfg.prompts_path), int(cfg.n_samples), int(cfg.seed))
    key = generation_key(model_identity, prompts, cfg)
    path = Path(cache_dir) / "generated" / f"{content_key(key, 20)}.json"
    remove_dead_temporaries(path.parent)
    answers = cached_answers(path, key, prompts)
    if answers is not None:
        log.info("calibration answers found in the cache (%s)", path.name)
    else:
        answers = generate_answers(
            model,
            tokenizer,
            prompts,
            int(cfg.max_new_tokens),
            int(cfg.generation_batch_size),
            float(cfg.temperature),
            int(cfg.seed),
        )
        entry = {"prompts": prompts, "answers": answers}
        write_optional("generated calibration entry", path, lambda: write_keyed_json(path, key, entry))
    publish("calibration_generated", ["prompt", "answer"], list(zip(prompts, answers)))
    records = [
        {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]}
        for p, a in zip(prompts, answers, strict=True)
    ]
    return [render_record(record, None, "messages", tokenizer) for record in records]
