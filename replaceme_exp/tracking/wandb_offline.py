"""Read an offline W&B run (``.../wandb/offline-run-*``) without a server: its config, group, name,
tags, logged steps, summary, exit code and logged tables.

wandb 0.31 has no Python reader of its transaction log (the ``.wandb`` file): the SDK writes it
through its Go core. The file is a LevelDB-style log of ``wandb_internal_pb2.Record`` protobufs
(wandb's own message definitions): a 7-byte header (``:W&B``, the magic 0xBEE1, version 0), then
blocks of 32 KiB, each a sequence of chunks (a 4-byte CRC-32, a 2-byte length, a 1-byte type:
1 full, 2 first, 3 middle, 4 last piece of a record); a block's tail shorter than a chunk header
is zero padding. Tables are files under ``files/`` that the history names.

    python -m replaceme_exp.tracking.wandb_offline results/hydra/multirun/<sweep>/0/wandb/offline-run-*
"""

from __future__ import annotations

import argparse
import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

HEADER = struct.Struct("<4sHB")  # ident, magic, version
HEADER_IDENT, HEADER_MAGIC = b":W&B", 0xBEE1
BLOCK = 32768
CHUNK = struct.Struct("<IHB")  # crc32, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def record_bytes(path: str | Path) -> Iterator[bytes]:
    """The serialized records of a ``.wandb`` file, in order (a torn last record is dropped)."""
    data = Path(path).read_bytes()
    if len(data) < HEADER.size:
        raise ValueError(f"{path}: not a W&B run file (shorter than its header)")
    ident, magic, _version = HEADER.unpack_from(data)
    if ident != HEADER_IDENT or magic != HEADER_MAGIC:
        raise ValueError(f"{path}: not a W&B run file (header {data[:HEADER.size]!r})")
    offset, pieces = HEADER.size, []
    while offset + CHUNK.size <= len(data):
        left_in_block = BLOCK - offset % BLOCK
        if left_in_block < CHUNK.size:  # zero padding to the next block
            offset += left_in_block
            continue
        crc, length, kind = CHUNK.unpack_from(data, offset)
        body = data[offset + CHUNK.size : offset + CHUNK.size + length]
        offset += CHUNK.size + length
        if kind == 0 and length == 0:  # unwritten space at the end of a block
            continue
        if len(body) < length or zlib.crc32(bytes([kind]) + body) & 0xFFFFFFFF != crc:
            break  # the writer was killed mid-record
        if kind == FULL:
            yield body
        elif kind == FIRST:
            pieces = [body]
        elif kind == MIDDLE:
            pieces.append(body)
        elif kind == LAST:
            yield b"".join([*pieces, body])
            pieces = []


def records(path: str | Path) -> Iterator:
    """The ``wandb_internal_pb2.Record`` messages of a ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2

    for raw in record_bytes(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _items(items) -> dict:
    """Record items as a dict; an item with a nested key (a table's ``path``, ``nrows``, ...)
    goes into nested dicts (``{"samples/generation": {"path": ...}}``)."""
    out: dict = {}
    for item in items:
        keys = list(item.nested_key) or [item.key]
        place = out
        for key in keys[:-1]:
            place = place.setdefault(key, {})
        place[keys[-1]] = _value(item.value_json)
    return out


@dataclass
class OfflineRun:
    """What an offline run holds. ``history``: one dict per logged step (with ``_step``);
    ``summary``: the last summary value of each key; ``exit_code``: None while unfinished."""

    directory: Path
    run_id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    exit_code: int | None = None

    def values(self, key: str) -> list:
        """Every logged value of ``key``, in step order."""
        return [step[key] for step in self.history if key in step]

    def steps_of(self, key: str) -> list[int]:
        """The steps at which ``key`` was logged."""
        return [step["_step"] for step in self.history if key in step]

    def table(self, key: str, index: int = -1) -> tuple[list[str], list[list]]:
        """A logged ``wandb.Table`` (the last one logged under ``key`` by default): (columns, rows)."""
        logged = self.values(key)
        if not logged:
            raise KeyError(f"no table logged under {key!r} in {self.directory}")
        reference = logged[index]
        content = json.loads((self.directory / "files" / reference["path"]).read_text())
        return content["columns"], content["data"]


def read_offline_run(directory: str | Path, wait_for_exit: float = 0.0) -> OfflineRun:
    """The offline run in ``directory`` (an ``offline-run-*`` folder holding ``run-<id>.wandb``).

    wandb's service process may still be writing the file when ``run.finish()`` has returned (on a
    loaded machine, for a moment): ``wait_for_exit`` seconds, read again until the run's exit
    record is there."""
    deadline = time.monotonic() + wait_for_exit
    while True:
        run = _read_once(Path(directory))
        if run.exit_code is not None or time.monotonic() >= deadline:
            return run
        time.sleep(0.2)


def _read_once(directory: Path) -> OfflineRun:
    files = sorted(directory.glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {directory}")
    run = OfflineRun(directory)
    for record in records(files[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id, run.name, run.group, run.project = r.run_id, r.display_name, r.run_group, r.project
            run.tags = list(r.tags)
            run.config.update(_items(r.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="an offline-run-* folder")
    args = parser.parse_args()
    run = read_offline_run(args.run_dir)
    print(f"run {run.run_id} ({run.name}), group {run.group!r}, project {run.project!r}, exit code {run.exit_code}")
    print(f"{len(run.history)} logged steps; keys: {', '.join(sorted({k for s in run.history for k in s}))}")
    for key in sorted(run.summary):
        print(f"  {key} = {run.summary[key]}")


if __name__ == "__main__":
    main()
