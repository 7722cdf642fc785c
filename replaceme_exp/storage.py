"""Files that are whole or absent, keys that name content, and cache entries that know what they hold.

Every file the project writes for later reading (rows, cache entries, baselines, generated data,
memos, status files) goes through :func:`atomic_path`: it is written to a temporary file beside its
target and renamed over it, so a reader never sees half a file and a killed or full-disk write
leaves none. Every cache key is :func:`content_key` of what the entry depends on.

Every cache entry also carries the key it was written for and a checksum over key and content
(:func:`write_keyed_json`, :func:`write_keyed_tensors`); reading it back (:func:`read_keyed_json`,
:func:`read_keyed_tensors`) checks both against the key asked for. An entry that is unreadable, fails
its checksum, was written for another key (a file copied over another name) or carries no key (an
older format) is reported in one warning naming the file and what it holds, removed, and a miss: the
caller recomputes. Writing an entry is optional (:func:`write_optional`): a full disk or a read-only
folder costs the entry, with a warning, never the job. Temporary files of killed writers are removed
by :func:`remove_dead_temporaries`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

log = logging.getLogger(__name__)

# A temporary file or folder whose owner cannot be checked (another host sharing the folder, an
# older naming) is debris only when untouched this long: no write of the project takes an hour.
STALE_AFTER_S = 3600
HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def content_key(value: Any, length: int | None = None) -> str:
    """SHA-256 of ``value`` as canonical JSON (keys sorted; non-JSON values by ``str``), hex,
    cut to ``length`` characters."""
    digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
    return digest if length is None else digest[:length]


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed over ``path`` when the block ends
    without an error, removed otherwise (its parent folder is created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}@{HOST}.tmp")
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` to ``path``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` to ``path``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_json(path: str | os.PathLike, value: Any) -> Path:
    """``value`` as JSON to ``path``, atomically (non-JSON values by ``str``)."""
    return write_text(path, json.dumps(value, default=str))


def canonical(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples as lists, non-JSON values by ``str``)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 64 else f"{text[:16]}...{text[-45:]}"  # a hash's start, a path's end


def key_problem(stored: Any, asked: Any) -> str | None:
    """None when ``stored`` is the key ``asked`` for (compared as JSON), else what differs, for a
    one-line message: ``is the entry for length=3 where length=2 was asked``."""
    asked = canonical(asked)
    if stored == asked:
        return None
    if isinstance(stored, dict) and isinstance(asked, dict):
        fields = sorted(k for k in stored.keys() | asked.keys() if stored.get(k, ...) != asked.get(k, ...))
        held = ", ".join(f"{k}={_short(stored[k])}" if k in stored else f"no {k}" for k in fields)
        wanted = ", ".join(f"{k}={_short(asked[k])}" if k in asked else f"no {k}" for k in fields)
    else:
        held, wanted = _short(stored), _short(asked)
    return f"is the entry for {held} where {wanted} was asked"


def discard_entry(path: str | os.PathLike, what: str, problem: str) -> None:
    """Report the entry at ``path`` (a ``what``) in one warning saying ``problem``, and remove it."""
    log.warning("%s %s %s: removed, recomputing", what, path, problem)
    try:
        Path(path).unlink(missing_ok=True)
    except OSError:  # a read-only cache: the entry stays, and is checked (and refused) again
        pass


def entry_checksum(key: Any, value: Any) -> str:
    """SHA-256 over an entry's key and JSON value."""
    return content_key({"key": key, "value": value})


def write_keyed_json(path: str | os.PathLike, key: dict, value: Any) -> Path:
    """``value`` (JSON-able, not None) to ``path`` with the ``key`` it is for and a checksum over
    both, atomically."""
    key, value = canonical(key), canonical(value)
    return write_json(path, {"key": key, "value": value, "sha256": entry_checksum(key, value)})


def read_keyed_json(path: str | os.PathLike, key: dict, what: str) -> Any:
    """The value stored at ``path`` for ``key``; None when there is none, or when the entry is
    unreadable, fails its checksum, holds another key or none (reported, removed: see the module)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text())
        if not isinstance(entry, dict):
            raise TypeError(f"a JSON {type(entry).__name__}, not an entry")
        stored = entry.get("key")
        if stored is None:
            problem = "carries no key (written by an older version)"
        elif entry.get("sha256") != entry_checksum(stored, entry["value"]):
            problem = "fails its checksum"
        else:
            problem = key_problem(stored, key)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # truncated, a flipped bit, not a dict
        problem = f"is unreadable ({type(err).__name__}: {err})"
    if problem is not None:
        discard_entry(path, what, problem)
        return None
    return entry["value"]


KEY_TENSOR = "_key"
CHECKSUM_FIELD = "_sha256"


def tensor_digest(tensors: dict) -> str:
    """SHA-256 over named tensors (names, dtypes, shapes and bytes)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return h.hexdigest()


def write_keyed_tensors(path: str | os.PathLike, key: dict, tensors: dict) -> Path:
    """Named tensors to ``path`` (``torch.save``) with the ``key`` they are for (a uint8 tensor of
    its JSON) and a checksum over all of them, atomically. A full disk raises ``OSError``."""
    import torch

    key_json = json.dumps(canonical(key), sort_keys=True).encode()
    payload = {**tensors, KEY_TENSOR: torch.frombuffer(bytearray(key_json), dtype=torch.uint8)}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: a full disk is an OSError
        torch.save({**payload, CHECKSUM_FIELD: tensor_digest(payload)}, f)
    return Path(path)


def read_keyed_tensors(path: str | os.PathLike, key: dict, what: str) -> dict | None:
    """The named tensors stored at ``path`` for ``key`` (without the key and checksum); None as
    :func:`read_keyed_json`."""
    import torch

    path = Path(path)
    if not path.is_file():
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(payload, dict) or KEY_TENSOR not in payload:
            problem = "carries no key (written by an older version)"
        elif payload.pop(CHECKSUM_FIELD, None) != tensor_digest(payload):
            problem = "fails its checksum"
        else:
            stored = json.loads(bytes(payload.pop(KEY_TENSOR).tolist()).decode())
            problem = key_problem(stored, key)
    except Exception as err:  # noqa: BLE001 - unpickling errors of a truncated file vary
        problem = f"is unreadable ({type(err).__name__}: {err})"
    if problem is not None:
        discard_entry(path, what, problem)
        return None
    return payload


def write_optional(what: str, path: str | os.PathLike, write: Callable[[], Any]) -> bool:
    """Run ``write`` (which writes the ``what`` at ``path``, a cache entry that only saves time);
    an ``OSError`` (a full disk, a read-only folder) is one warning, and False, not a failed job."""
    try:
        write()
    except OSError as err:
        log.warning("cannot write %s %s (%s): going on without it", what, path, err)
        return False
    return True


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


# atomic_path's `.<name>.<pid>@<host>.tmp` (older files: `.<name>.<pid>.tmp`, host unknown)
TEMPORARY = re.compile(r"^\..+\.(\d+)(?:@([A-Za-z0-9_]+))?\.tmp$")


def temporary_writer(name: str) -> tuple[int, str | None] | None:
    """The pid and host that write the temporary file called ``name`` (host None in older names),
    or None when ``name`` is not one of :func:`atomic_path`'s temporary files."""
    match = TEMPORARY.match(name)
    return None if match is None else (int(match.group(1)), match.group(2))


def left_by_killed_writer(path: str | os.PathLike, now: float | None = None) -> bool:
    """Whether the temporary file at ``path`` was left by a writer that is gone: a process of this
    host that no longer exists, or (another host's, or a name without its host, whose pid means
    nothing here) a file untouched for ``STALE_AFTER_S``."""
    writer = temporary_writer(Path(path).name)
    if writer is None:
        return False
    pid, host = writer
    if host == HOST:
        return pid != os.getpid() and not pid_alive(pid)
    if host is None and pid_alive(pid):  # perhaps this host's writer, still writing
        return False
    try:
        return (now or time.time()) - Path(path).stat().st_mtime >= STALE_AFTER_S
    except OSError:
        return False


def remove_dead_temporaries(folder: str | os.PathLike) -> int:
    """Remove the temporary files of :func:`atomic_path` in ``folder`` that killed writers left
    (:func:`left_by_killed_writer`). Returns how many were removed."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    now = time.time()
    for name in names:
        path = Path(folder) / name
        if not left_by_killed_writer(path, now):
            continue
        try:
            path.unlink()
            removed += 1
        except OSError:  # gone meanwhile, or not ours to remove
            continue
    if removed:
        log.info("removed %d temporary files killed jobs left in %s", removed, folder)
    return removed


def process_umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def readable_by_others(directory: str | os.PathLike) -> None:
    """Give ``directory`` and everything in it the modes a plain ``mkdir`` / write under the process's
    umask gives (``mkdtemp`` makes 0700 folders, safetensors writes 0600 files), so other users of a
    shared results folder or cache can read it."""
    umask = process_umask()
    root = Path(directory)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


@contextmanager
def file_lock(path: str | os.PathLike, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` (created) across threads, processes and nodes sharing the
    folder; ``on_wait()`` is called once when another holder makes this one wait. Yields whether the
    lock is held: False on a filesystem without ``flock`` (Lustre noflock, some NFS/FUSE mounts),
    where the caller goes on unlocked (said in one warning)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        locked = True
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as err:
            log.warning("no lock on %s (%s): identical work started at once may run twice", path.parent, err)
            locked = False
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)
