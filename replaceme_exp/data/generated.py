"""Self-generated chat calibration data: prompts answered by the model being pruned, each prompt
and answer rendered as a user/assistant chat in the model's chat template (the paper's
"orca_generated": the model's own answers to SlimOrca's instruction prompts).

The prompts come from a dataset (``calibration.prompts_dataset``: SlimOrca from the hub for the
paper's row, or a local JSONL file in the same format) or from a prompt list.

Offline, the prompts ship with the project (``prompts/instructions.jsonl``: 256 general
instructions, none about capitals, opposites or the demo prompts of ``eval.samples``); a JSONL
file with a ``prompt`` field, or a text file with one prompt per line, can replace them. Answers
are generated in batches with a KV cache (greedy, or seeded sampling), with progress lines inside
a batch (tokens generated), and cached batch by batch, keyed by content (the model's identity, the
batch's prompts and every generation setting): a sweep generates once, an interrupted generation
resumes at its first unfinished batch, and a smaller ``n_samples`` reuses the first batches of a
larger one (:func:`generation_batches`: the batches do not depend on ``n_samples``). A cached
batch carries that key and a checksum (:func:`~replaceme_exp.storage.write_keyed_json`) and must
hold one answer per prompt of its batch: anything else is reported, removed and generated again.
The embedded model's answers for the default job ship with the project
(``prompts/self_generated_answers.jsonl``, ``make self-generated-answers``): a batch whose key is
exactly one of its entries is copied into the cache instead of being generated.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import random
import time
from pathlib import Path

import torch

from replaceme_exp.data import files
from replaceme_exp.data.files import JsonRecords, TextFile
from replaceme_exp.data.hub import HubDataset
from replaceme_exp.data.sources import dataset_records, first_user_turn, render_prompts, render_record
from replaceme_exp.errors import ConfigError
from replaceme_exp.progress import Progress, progress_counter, token_steps
from replaceme_exp.samples import publish
from replaceme_exp.storage import (
    canonical,
    content_key,
    discard_entry,
    entry_checksum,
    read_keyed_json,
    remove_dead_temporaries,
    write_keyed_json,
    write_optional,
)

log = logging.getLogger(__name__)

SHIPPED_PROMPTS = Path(__file__).with_name("prompts") / "instructions.jsonl"
# The embedded model's own answers to the default job's prompts (make self-generated-answers): one
# keyed entry per generation batch, copied into the cache when its key is exactly the one asked for.
SHIPPED_ANSWERS = Path(__file__).with_name("prompts") / "self_generated_answers.jsonl"


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


def prompt_files(cfg, key: str) -> None:
    """The prompts file (``prompts_path``) and the local prompt records (``prompts_dataset: json``) can be
    opened."""
    if cfg.prompts_path is not None:
        files.check_readable(f"{key}.prompts_path", cfg.prompts_path)
    if getattr(cfg, "prompts_dataset", None) == "json":
        data, name = cfg.prompts_data_files, f"{key}.prompts_data_files"
        if not (isinstance(data, list) and data or isinstance(data, str)):
            raise ConfigError(name, data, "no such file (prompts_dataset=json reads it)")
        files.check_readable(name, data)


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
def generate_batch(
    model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, counter: Progress | None = None
) -> list[str]:
    """One answer per prompt of one batch, in order: the left-padded rendered prompts through one
    ``model.generate`` call (KV cache), greedy when ``temperature`` is 0, else sampled from torch's
    current random state (the caller seeds it). Each decoding step counts ``len(prompts)`` tokens
    on ``counter`` (a batch that ends early counts the rest at its end). Returns the decoded answers
    without special tokens, stripped."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts = render_prompts(tokenizer, prompts)
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    finally:
        tokenizer.padding_side = padding_side
    sampling = {"do_sample": True, "temperature": temperature, "top_p": None, "top_k": None}
    greedy = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    steps = token_steps(counter, len(prompts)) if counter is not None else None
    out = model.generate(
        **batch,
        max_new_tokens=int(max_new_tokens),
        num_beams=1,
        pad_token_id=pad,
        use_cache=True,
        stopping_criteria=[steps] if steps is not None else None,
        **(sampling if temperature > 0 else greedy),
    )
    if counter is not None:
        counter.update(len(prompts) * (int(max_new_tokens) - steps.steps))
    new = out[:, batch["input_ids"].shape[1] :]
    return [a.strip() for a in tokenizer.batch_decode(new, skip_special_tokens=True)]


def generate_answers(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[str]:
    """One answer per prompt, in order, uncached: :func:`generate_batch` on consecutive batches of
    ``batch_size`` prompts after ``torch.manual_seed(seed)`` (what :func:`self_generated_documents`
    computes batch by batch)."""
    torch.manual_seed(seed)
    answers: list[str] = []
    for start in range(0, len(prompts), batch_size):
        answers += generate_batch(model, tokenizer, prompts[start : start + batch_size], max_new_tokens, temperature)
    return answers


def generation_key(model_identity: str, batch: list[str], preceding: list[str], cfg) -> dict:
    """Key of one generated batch: the model's identity hash, the batch's prompts (in order: who
    shares a padded batch can move a greedy answer) and every setting that changes an answer;
    sampled answers also depend on the random state the batch starts from, so their key also names
    the prompts of the batches before it (``preceding``). The cache file is named by its
    :func:`content_key`."""
    key = {
        "model": model_identity,
        "prompts": content_key(batch),
        "max_new_tokens": int(cfg.max_new_tokens),
        "temperature": float(cfg.temperature),
        "seed": int(cfg.seed),
        "batch_size": int(cfg.generation_batch_size),
        "torch": torch.__version__,
    }
    if float(cfg.temperature) > 0:
        key["preceding"] = content_key(preceding)
    return key


def cached_answers(path: Path, key: dict, prompts: list[str]) -> dict | None:
    """The entry cached at ``path`` for ``key``: ``{"prompts", "answers"[, "random_state"]}`` with
    one answer string per prompt of ``prompts``; None (reported and removed when the entry is bad)
    otherwise."""
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
    elif float(key["temperature"]) > 0 and not isinstance(entry.get("random_state"), dict):
        problem = "holds sampled answers without the random state after them"
    else:
        return entry
    discard_entry(path, "generated calibration entry", problem)
    return None


@functools.lru_cache(maxsize=4)
def shipped_entries(path: Path = SHIPPED_ANSWERS) -> dict[str, dict]:
    """The entries of a shipped answers file (JSONL, one keyed entry per line as the cache writes
    them: ``{"key", "value", "sha256"}``) by the :func:`content_key` of their key; lines whose
    checksum fails are left out (logged)."""
    entries: dict[str, dict] = {}
    if not path.is_file():
        return entries
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
            if entry["sha256"] != entry_checksum(entry["key"], entry["value"]):
                raise ValueError("fails its checksum")
        except (ValueError, KeyError, TypeError) as err:
            log.warning("shipped answers %s line %d left out: %s", path, number, err)
            continue
        entries[content_key(canonical(entry["key"]))] = entry
    return entries


def shipped_answers(key: dict, path: Path = SHIPPED_ANSWERS) -> dict | None:
    """The value of the shipped entry whose key is exactly ``key`` (None: no such entry)."""
    entry = shipped_entries(path).get(content_key(canonical(key)))
    return entry["value"] if entry is not None and entry["key"] == canonical(key) else None


def random_state() -> dict:
    """torch's CPU (and CUDA) random state, as base64 text (stored after a sampled batch)."""
    state = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_random_state(state: dict) -> None:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["cpu"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])


def generation_batches(cfg) -> tuple[list[str], list[list[str]]]:
    """The ``n_samples`` prompts of a generated calibration, and the batches that answer them.

    The answer of a prompt is its answer in its batch, and the batches do not depend on
    ``n_samples``: the shipped (or a file's) prompt pool in the order drawn by ``seed``, cut into
    consecutive batches of ``generation_batch_size``; ``n_samples`` takes the first batches that
    hold its prompts (the last one whole, so a count that is not a multiple of the batch size
    answers a few more prompts than it uses). So any smaller count reuses the cached answers of a
    larger one. Prompts drawn from a dataset (``prompts_dataset``) are batched as drawn."""
    n, size = int(cfg.n_samples), int(cfg.generation_batch_size)
    if getattr(cfg, "prompts_dataset", None):
        prompts = dataset_prompts(cfg, n, int(cfg.seed))
        return prompts, [prompts[i : i + size] for i in range(0, n, size)]
    pool = load_prompts(cfg.prompts_path)
    prompts = chosen_prompts(pool, n, int(cfg.seed))
    answered = chosen_prompts(pool, min(len(pool), -(-n // size) * size), int(cfg.seed))
    return prompts, [answered[i : i + size] for i in range(0, len(answered), size)]


def store(path: Path, key: dict, entry: dict) -> None:
    """One batch's entry into the cache (atomically; a full disk only warns)."""
    write_optional("generated calibration entry", path, lambda: write_keyed_json(path, key, entry))


def batch_answers(
    cfg,
    batches: list[list[str]],
    tokenizer,
    model,
    model_identity: str,
    cache_dir: str | os.PathLike,
    shipped: bool = True,
    clock=time.monotonic,
) -> list[tuple[dict, dict]]:
    """Each batch (of :func:`generation_batches`) as ``(key, {"prompts", "answers"[, "random_state"]})``:
    from ``cache_dir/generated/<key>.json``, else (``shipped``) from the shipped answers file when it
    holds an entry of exactly that key, else generated; each batch found elsewhere or generated is
    written to the cache (atomically) when it is done, so an interrupted generation resumes at the
    first unfinished batch. Progress: generated tokens of the missing batches (``clock``: its time)."""
    folder = Path(cache_dir) / "generated"
    remove_dead_temporaries(folder)
    keys = [generation_key(model_identity, b, [p for a in batches[:i] for p in a], cfg) for i, b in enumerate(batches)]
    paths = [folder / f"{content_key(key, 20)}.json" for key in keys]
    found: list[dict | None] = [cached_answers(path, key, b) for path, key, b in zip(paths, keys, batches)]
    for i, key in enumerate(keys):
        value = shipped_answers(key) if found[i] is None and shipped else None
        if (
            value is not None
            and value.get("prompts") == batches[i]
            and len(value.get("answers", ())) == len(batches[i])
        ):
            found[i] = value
            store(paths[i], keys[i], value)
    seeded = sum(entry is not None for entry in found)
    if seeded:
        log.info("calibration answers of %d of %d batches found (cache or shipped answers)", seeded, len(batches))
    missing = [i for i, entry in enumerate(found) if entry is None]
    if not missing:
        return [(key, entry) for key, entry in zip(keys, found)]  # type: ignore[misc]
    if model is None:
        raise ConfigError("calibration.source", "generated", "needs the model to answer its prompts")
    temperature = float(cfg.temperature)
    sampled = temperature > 0
    total = sum(len(batches[i]) for i in missing) * int(cfg.max_new_tokens)
    with progress_counter(total, "generating calibration answers", "token", clock=clock) as counter:
        for i in missing:
            if i == 0 or not sampled:
                torch.manual_seed(int(cfg.seed))
            else:  # the state after the batch before (found, or generated just now)
                restore_random_state(found[i - 1]["random_state"])  # type: ignore[index]
            answers = generate_batch(model, tokenizer, batches[i], int(cfg.max_new_tokens), temperature, counter)
            entry = {"prompts": batches[i], "answers": answers}
            if sampled:
                entry["random_state"] = random_state()
            found[i] = entry
            store(paths[i], keys[i], entry)
    return [(key, entry) for key, entry in zip(keys, found)]  # type: ignore[misc]


def self_generated_documents(
    cfg, tokenizer, model, model_identity: str, cache_dir: str | os.PathLike, clock=time.monotonic
) -> list[str]:
    """``cfg.n_samples`` chats (prompt, the model's answer) in the chat template; the answers come
    batch by batch from :func:`batch_answers` (cache, shipped answers, or generated)."""
    if model is None:
        raise ConfigError("calibration.source", "generated", "needs the model to answer its prompts")
    prompts, batches = generation_batches(cfg)
    answered = batch_answers(cfg, batches, tokenizer, model, model_identity, cache_dir, clock=clock)
    answers = [a for _, entry in answered for a in entry["answers"]][: len(prompts)]
    publish("calibration_generated", ["prompt", "answer"], list(zip(prompts, answers)))
    records = [
        {"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": a}]}
        for p, a in zip(prompts, answers, strict=True)
    ]
    return [render_record(record, None, "messages", tokenizer) for record in records]
