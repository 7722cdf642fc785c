"""Upload offline W&B runs once you are online: ``make wandb-sync SWEEP=<sweep or results dir>``.

Finds every ``offline-run-*`` folder under the given paths and runs ``wandb sync`` on them, with:

- a reachability check first: no answer from the W&B server (``WANDB_BASE_URL``, else the
  ``base_url`` of wandb's settings file, else W&B's cloud) within ``--timeout`` seconds ends the
  command with one line, ``could not reach the W&B server at <url> in <N> s (<why>)``, and exit 1;
- a time limit on the upload itself (``--sync-timeout``): a sync that never ends is stopped with
  one line, and exit 1;
- nothing written into the working directory: wandb runs in a temporary folder, with its run
  directory, cache, data and artifact folders (``WANDB_DIR``, ``WANDB_CACHE_DIR``,
  ``WANDB_DATA_DIR``, ``WANDB_ARTIFACT_DIR``, unless set) in it, removed afterwards.

    python -m replaceme_exp.tracking.wandb_sync results/hydra/multirun/2026-01-01_10-00-00 [--dry-run]
"""

from __future__ import annotations

import argparse
import configparser
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "https://api.wandb.ai"
FOLDER_VARIABLES = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")


def offline_runs(paths: list[str | Path]) -> list[Path]:
    """The ``offline-run-*`` folders under ``paths`` (each path may be one itself), sorted."""
    found = set()
    for path in map(Path, paths):
        if path.name.startswith("offline-run-") and path.is_dir():
            found.add(path.resolve())
        elif path.is_dir():
            found.update(p.resolve() for p in path.rglob("offline-run-*") if p.is_dir())
    return sorted(found)


def server_url(environ: dict | None = None) -> str:
    """The W&B server wandb would talk to: ``WANDB_BASE_URL``, else the ``base_url`` in wandb's
    settings file (``WANDB_CONFIG_DIR``, else ``~/.config/wandb``), else the cloud."""
    environ = os.environ if environ is None else environ
    if environ.get("WANDB_BASE_URL"):
        return environ["WANDB_BASE_URL"]
    config_dir = Path(environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb")
    parser = configparser.ConfigParser()
    try:
        parser.read(config_dir / "settings")
        return parser.get("default", "base_url", fallback=DEFAULT_BASE_URL) or DEFAULT_BASE_URL
    except configparser.Error:
        return DEFAULT_BASE_URL


def unreachable(url: str, timeout: float) -> str | None:
    """Why the server at ``url`` does not accept a connection within ``timeout`` seconds (the
    name lookup included), or None when it does."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err.strerror or type(err).__name__)

    worker = threading.Thread(target=connect, daemon=True)  # a name lookup ignores socket timeouts
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else "no answer"


def sync(paths: list[str | Path], timeout: float, sync_timeout: float, wandb_args: list[str]) -> int:
    """Sync the offline runs under ``paths``; prints what it does; returns the exit code."""
    runs = offline_runs(paths)
    if not runs:
        print(f"no offline W&B runs under {' '.join(map(str, paths))}", file=sys.stderr)
        return 1
    print(f"offline runs to sync: {len(runs)}", flush=True)
    dry_run = "--dry-run" in wandb_args
    url = server_url()
    if not dry_run and (why := unreachable(url, timeout)):
        print(f"could not reach the W&B server at {url} in {timeout:g} s ({why}); nothing synced", file=sys.stderr)
        return 1
    scratch = Path(tempfile.mkdtemp(prefix="wandb-sync-"))
    env = dict(os.environ)
    for variable in FOLDER_VARIABLES:
        env.setdefault(variable, str(scratch))
    wandb = Path(sys.executable).with_name("wandb")
    command = [str(wandb) if wandb.exists() else "wandb", "sync", *wandb_args, *map(str, runs)]
    started = time.monotonic()
    try:
        code = subprocess.run(command, cwd=scratch, env=env, stdin=subprocess.DEVNULL, timeout=sync_timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"wandb sync did not finish in {sync_timeout:g} s: stopped (is {url} reachable?)", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if code != 0:
        print(f"wandb sync failed (exit code {code}) after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="sweep folders, results folders or offline-run-* folders")
    wait = float(os.environ.get("WANDB_SYNC_TIMEOUT", 20))
    parser.add_argument("--timeout", type=float, default=wait, help="seconds to wait for the W&B server (20)")
    parser.add_argument("--sync-timeout", type=float, default=3600.0, help="seconds the upload may take (3600)")
    args, wandb_args = parser.parse_known_args(argv)
    return sync(args.paths, args.timeout, args.sync_timeout, wandb_args)


if __name__ == "__main__":
    sys.exit(main())
