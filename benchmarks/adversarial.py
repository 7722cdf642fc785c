"""The adversarial battery of issue 23: bad inputs, injected faults and security probes against
``run.py`` (the tiny ``debug=smoke`` job, offline) and the Makefile / report commands, each in its
own temporary folders, classified from what a user sees: the exit code, the row it wrote, whether
a traceback was printed, whether the refusal came before the model loaded.

    make battery                                   # all 140 probes (28 min on 2 busy cores)
    python benchmarks/adversarial.py --list        # the probes, one line each
    python benchmarks/adversarial.py --only cuts   # the probes whose name or category holds "cuts"
    python benchmarks/adversarial.py --out results/battery.json --keep

Prints one line per probe (name, category, outcome, detail) and the summary figures, and writes
them as JSON to ``--out``. A measurement, not a test: the figures say how far the project is from
"every bad input refused in one line before the model loads, no wrong finished row, no probe
vulnerable"; re-run it after a fix. At most two processes run at once.

Outcomes:
- bad_input: ``refused_clearly`` (non-zero exit, no traceback, the refusal line names the key, the
  value or the file; ``after_load`` when the job had started loading the model first: a ``stage
  load ...`` log line; a refusal before it fails at validation or composition),
  ``refused_unclearly`` (the refusal names none of them), ``accepted_silently`` (exit 0, no
  warning naming it), ``accepted_with_warning``, ``crashed`` (a traceback, a signal or a timeout;
  ``no_row`` when no row was written).
- fault: ``survived`` (the finished row is right, nothing left behind, no traceback), ``partly``
  (right but with a traceback, debris, or a refusal where the job should have recovered), ``not``
  (a wrong finished row, a lost model, a crash); ``wrong_finished_row`` / ``model_lost`` flags.
- security: ``safe`` or ``vulnerable``.
- ``probe_error``: the probe itself could not run (its clean run failed, say): not counted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
TRACEBACK = "Traceback (most recent call last)"
LOADED = "stage load done"
LOADING = "stage load ..."  # the load stage started: anything refused from here on was not refused before loading
RUN_TIMEOUT = 300  # seconds per process; the machine may be shared
WORKERS = 2
SMOLLM2_DIR = "smollm2-135m-instruct"

# ---------------------------------------------------------------------------------------------
# Classifying what a run showed (pure functions: tests/unit/project/test_battery.py)


@dataclass
class Verdict:
    outcome: str
    detail: str = ""
    after_load: bool = False  # bad_input refused / crashed after the model had loaded
    no_row: bool = False  # crashed without writing a row
    wrong_finished_row: bool = False
    model_lost: bool = False


LOG_PREFIX = re.compile(r"^\[[^\]]*\]\[[^\]]*\]\[[A-Z]+\] - ")


def refusal_line(output: str, rows: list[dict]) -> str:
    """What the user is told on a refusal: the ``invalid configuration: ...`` line, else the job
    summary's ``job <id> failed ...: <error>`` (without the log prefix and the row's path), else
    the failed row's error (first line), else the last line of output."""
    lines = [LOG_PREFIX.sub("", line.strip()) for line in output.splitlines() if line.strip()]
    for line in lines:
        if "invalid configuration:" in line:
            return line.split("invalid configuration:", 1)[1].strip()
    for line in lines:
        if re.search(r"\bjob \S+ failed\b", line):
            return re.sub(r", (row|model) \S+", "", line)
    for row in rows:
        if row.get("status") == "failed" and row.get("error"):
            return str(row["error"]).splitlines()[0]
    return lines[-1] if lines else ""


def failed_stage(output: str, rows: list[dict]) -> str | None:
    for row in rows:
        if row.get("failed_stage"):
            return str(row["failed_stage"])
    match = re.search(r"failed in stage ([\w ()-]+?)(?: after|:)", output)
    return match.group(1) if match else None


def model_loaded(output: str) -> bool:
    """Whether the job got as far as loading the model (its ``load`` stage started): a refusal
    from then on did not come before the model loaded (one that does fails at validation)."""
    return LOADING in output


def names_any(text: str, mentions: list[str]) -> bool:
    low = text.lower()
    return any(m.lower() in low for m in mentions)


def last_exception(output: str) -> str:
    """The exception line of the last traceback (the first unindented line after its header),
    else the last ``SomeError: ...`` line, else the last line."""
    lines = output.splitlines()
    headers = [i for i, line in enumerate(lines) if TRACEBACK in line]
    if headers:
        for line in lines[headers[-1] + 1 :]:
            if line.strip() and not line[:1].isspace():
                return LOG_PREFIX.sub("", line.strip())[:200]
    stripped = [LOG_PREFIX.sub("", line.strip()) for line in lines if line.strip()]
    for line in reversed(stripped):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", line):
            return line[:200]
    return (stripped[-1] if stripped else "")[:200]


def warning_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "WARNING" in line or "warning:" in line.lower()]


def classify_bad_input(code: int | None, output: str, rows: list[dict], mentions: list[str]) -> Verdict:
    """One bad input's outcome from the exit code (None: timed out), the combined stdout+stderr and
    the rows the run wrote; ``mentions``: a clear refusal names one of these (key, value, file)."""
    after_load = model_loaded(output)
    no_row = not rows
    if code is None:
        return Verdict("crashed", "timed out", after_load, no_row)
    if TRACEBACK in output or code < 0:
        what = last_exception(output) if TRACEBACK in output else f"killed by signal {-code}"
        return Verdict("crashed", what, after_load, no_row)
    if code == 0:
        warned = [line for line in warning_lines(output) if names_any(line, mentions)]
        if warned:
            return Verdict("accepted_with_warning", warned[0].strip()[:200], after_load)
        statuses = ",".join(sorted({str(r.get("status")) for r in rows})) or "no row"
        return Verdict("accepted_silently", f"exit 0 ({statuses})", after_load)
    line = refusal_line(output, rows)
    stage = f" [failed_stage={failed_stage(output, rows)}]" if failed_stage(output, rows) else ""
    outcome = "refused_clearly" if names_any(line, mentions) else "refused_unclearly"
    return Verdict(outcome, f"exit {code}{stage}: {line[:200]}", after_load)


def classify_fault(
    differences: list[str] | None,
    output: str,
    *,
    debris: list[str] = (),
    model_lost: bool = False,
    refused_clearly: bool = False,
    note: str = "",
) -> Verdict:
    """A fault's outcome. ``differences``: the columns in which the finished row differs from a
    clean run's (None: no finished row). ``output``: what the runs after the fault printed.
    ``refused_clearly``: no finished row, but a one-line refusal naming the problem."""
    tb = TRACEBACK in output
    extra = "; ".join(filter(None, [note, f"debris: {', '.join(debris)[:150]}" if debris else ""]))
    if differences:
        detail = f"wrong finished row ({', '.join(differences)[:150]})"
        return Verdict("not", "; ".join(filter(None, [detail, extra])), wrong_finished_row=True, model_lost=model_lost)
    if model_lost:
        return Verdict("not", "; ".join(filter(None, ["model lost", extra])), model_lost=True)
    if differences is None:
        if refused_clearly and not tb:
            return Verdict("partly", "; ".join(filter(None, ["refused in one line instead of recovering", extra])))
        what = last_exception(output) if tb else "no finished row"
        return Verdict("not", "; ".join(filter(None, [what, extra])))
    if tb or debris:
        return Verdict("partly", "; ".join(filter(None, ["traceback printed" if tb else "", extra])))
    return Verdict("survived", extra)


# Columns a fault must not change (a clean run of the same configuration is the reference).
RESULT_COLUMNS = (
    "cuts",
    "n_prune",
    "num_lts",
    "n_calib_samples",
    "n_calib_tokens",
    "ppl_heldout_baseline",
    "ppl_heldout",
    "cos_dist_before",
    "cos_dist_after",
    "transform_rms",
    "candidate_distances",
)


def _decoded(value):
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    if value != value:  # NaN: a missing cell
        return None
    return value


def _close(a, b, rel: float) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)
    return a == b


def row_differences(clean: dict, other: dict, columns=RESULT_COLUMNS, rel: float = 1e-5) -> list[str]:
    """The ``columns`` in which ``other`` differs from ``clean`` (both present in either)."""
    out = []
    for column in columns:
        a, b = _decoded(clean.get(column)), _decoded(other.get(column))
        if a is None and b is None:
            continue
        if not _close(a, b, rel):
            out.append(f"{column} {str(b)[:40]} vs clean {str(a)[:40]}")
    return out


# ---------------------------------------------------------------------------------------------
# Running things


@dataclass
class Run:
    argv: list[str]
    code: int | None  # None: timed out
    output: str
    seconds: float
    rows: list[dict]  # rows this run wrote


def _privileges_prefix() -> list[str]:
    """As root, drop the capabilities that override file permissions (so read-only folders are
    read-only, as for any user); elsewhere nothing."""
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv"):
        caps = "-dac_override,-dac_read_search,-fowner"
        return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--"]
    return []


PREFIX = _privileges_prefix()


def read_rows(results: Path) -> dict[str, dict]:
    """Every readable row file under ``results/runs`` by path."""
    import pandas as pd

    out = {}
    for file in sorted((results / "runs").glob("*/*.parquet")):
        try:
            out[str(file)] = pd.read_parquet(file).iloc[0].to_dict()
        except Exception:  # noqa: BLE001 - a truncated row file is the fault of some probes
            continue
    return out


def run_process(argv, cwd, env, timeout=RUN_TIMEOUT, kill_when: Callable[[str], bool] | None = None, log=None):
    """Run ``argv`` (its own process group) with stdout and stderr to one file; ``kill_when(output)``
    is polled every 0.1 s and, when true, the group gets SIGKILL. Returns (exit code or None on
    timeout, output, seconds)."""
    log = Path(log or tempfile.mktemp(prefix="battery-", suffix=".log"))
    start = time.monotonic()
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [*PREFIX, *map(str, argv)], cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        code = None
        while True:
            try:
                code = proc.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
                break
            if kill_when is not None and kill_when(log.read_text(errors="replace")):
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
                kill_when = None
                break
    return code, log.read_text(errors="replace"), time.monotonic() - start


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


class Sandbox:
    """One probe's folders: ``results``, ``cache`` (the converted SmolLM2 linked in), ``files``
    (inputs the probe writes), ``work`` (the working directory of its processes)."""

    def __init__(self, battery: "Battery", name: str, link_model: bool = True):
        self.battery = battery
        self.dir = battery.root / name
        self.results, self.cache, self.files, self.work = (self.dir / p for p in ("results", "cache", "files", "work"))
        for path in (self.results, self.cache, self.files, self.work):
            path.mkdir(parents=True, exist_ok=True)
        if link_model:
            battery.link_model(self.cache / SMOLLM2_DIR)
        self.runs: list[Run] = []
        self.count = 0

    def env(self, **extra) -> dict:
        """Offline, this sandbox's cache, one thread per process, the user's default error output."""
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT),
            REPLACEME_CACHE=str(self.cache), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled",
            CODECARBON_LOG_LEVEL="error", PYTHONUNBUFFERED="1",
        )  # fmt: skip
        env.pop("HYDRA_FULL_ERROR", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def hide(self, value):
        """``value`` (text, or rows) with this sandbox's folder written ``<probe>``: a refusal must
        not count as naming a key because the probe's folder name holds it."""
        if isinstance(value, list):
            return [{k: self.hide(v) if isinstance(v, str) else v for k, v in row.items()} for row in value]
        return value.replace(str(self.dir), "<probe>")

    def fmt(self, text: str) -> str:
        """``{files}``, ``{results}``, ``{cache}``, ``{dir}``, ``{work}`` replaced by the folders."""
        folders = {
            "files": self.files,
            "results": self.results,
            "cache": self.cache,
            "dir": self.dir,
            "work": self.work,
        }
        return re.sub(r"\{(files|results|cache|dir|work)\}", lambda m: str(folders[m.group(1)]), text)

    def base(self, results: Path, cache: Path, vision: bool = False) -> list[str]:
        """The tiny job (``debug=smoke``; for ``model=tiny_clip`` its image counterpart) in this
        sandbox's folders, without generation samples and without saving the model."""
        where = [f"results_dir={results}", f"cache_dir={cache}", "save_model=false"]
        if vision:
            return [*where, "n_prune=2", "tracking.wandb.mode=disabled", "tracking.codecarbon.enabled=false"]
        return ["debug=smoke", *where, "eval.samples=null"]

    def job(
        self, *overrides: str, results=None, cache=None, timeout=RUN_TIMEOUT, kill_when=None, env=None, config_dir=None
    ) -> Run:
        """``run.py`` on the tiny job with ``overrides`` (formatted with the sandbox's folders);
        an override of a base key (or of a key under it) replaces the base one; ``config_dir``:
        a folder of more config options (``--config-dir``)."""
        results, cache = Path(results or self.results), Path(cache or self.cache)
        overrides = [self.fmt(o) for o in overrides]
        keys = {_key(o) for o in overrides}
        vision = "model=tiny_clip" in overrides
        replaced = lambda b: any(k == _key(b) or k.startswith(_key(b) + ".") for k in keys)
        base = [b for b in self.base(results, cache, vision) if not replaced(b)]
        extra = ["--config-dir", self.fmt(str(config_dir))] if config_dir else []
        argv = [sys.executable, ROOT / "run.py", *extra, *base, *overrides]
        return self.call(argv, results=results, timeout=timeout, kill_when=kill_when, env=env)

    def call(self, argv, results=None, timeout=RUN_TIMEOUT, kill_when=None, env=None, cwd=None) -> Run:
        """Any command, in ``work``; the rows it wrote under ``results`` are collected."""
        results = Path(results or self.results)
        before = set(read_rows(results))
        self.count += 1
        log = self.dir / f"run{self.count}.log"
        code, output, seconds = run_process(argv, cwd or self.work, self.env(**(env or {})), timeout, kill_when, log)
        rows = [row for path, row in read_rows(results).items() if path not in before]
        run = Run([str(a) for a in argv], code, output, seconds, rows)
        self.runs.append(run)
        return run

    def write(self, name: str, data: bytes | str) -> Path:
        path = self.files / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path


def snapshot(folder: Path, pattern: str = "*") -> set[str]:
    return {str(p) for p in folder.glob(pattern)}


def finished(run: Run) -> dict | None:
    """The finished row a run wrote (None: it wrote none; a skip writes none, see :func:`skipped_run_id`)."""
    done = [r for r in run.rows if r.get("status") == "finished"]
    return done[-1] if done else None


def skipped_run_id(run: Run) -> str | None:
    match = re.search(r"job skipped: finished before as run (\w+)", run.output)
    return match.group(1) if match else None


def leftovers(*folders: Path) -> list[str]:
    """Temporary files and folders a killed job may leave (``.*.tmp``, ``.save-*``, ``.old-*``,
    ``.convert-*``, ``token-store-*``)."""
    out = []
    for folder in folders:
        if not folder.exists():
            continue
        for path in folder.rglob("*"):
            name = path.name
            if re.match(r"^\..*\.tmp$|^\.(save|old|convert)-|^token-store-|^tmp\w{8}$", name):
                out.append(str(path.relative_to(folder.parent)))
    return sorted(out)


class ProbeError(Exception):
    """The probe could not run (not a finding)."""


def require(run: Run, what: str) -> dict:
    row = finished(run)
    if row is None:
        raise ProbeError(f"{what} did not finish (exit {run.code}): {refusal_line(run.output, run.rows)[:150]}")
    return row


# ---------------------------------------------------------------------------------------------
# Shared material: the converted SmolLM2 (tokenizer of the tiny job), local checkpoints, clean runs


CHECKPOINT_SCRIPT = r"""
import json, shutil, sys
from pathlib import Path
import torch
from transformers import LlamaConfig, LlamaForCausalLM
out, tokenizer = Path(sys.argv[1]), Path(sys.argv[2])
config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                     tie_word_embeddings=True)
def save(name, seed, nan=False):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if nan:
        with torch.no_grad():
            model.model.layers[2].mlp.down_proj.weight[0, 0] = float("nan")
    model.save_pretrained(out / name, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer / f).is_file():
            shutil.copyfile(tokenizer / f, out / name / f)
save("ckpt_a", 1)
save("ckpt_b", 2)
save("ckpt_nan", 1, nan=True)
"""


class Battery:
    def __init__(self, root: Path, out=print):
        self.root = root
        self.out = out
        self.lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._memo: dict[str, object] = {}
        self.shared = root / "_shared"
        self.shared.mkdir(parents=True, exist_ok=True)

    def _once(self, key: str, make: Callable[[], object]):
        with self.lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._memo:
                try:
                    self._memo[key] = make()
                except Exception as err:  # noqa: BLE001 - every probe needing it reports it
                    self._memo[key] = err
            value = self._memo[key]
        if isinstance(value, Exception):
            raise ProbeError(f"shared setup {key} failed: {value}")
        return value

    def model_dir(self) -> Path:
        """The battery's own read-only copy of the converted SmolLM2 (copied from ``REPLACEME_CACHE``
        or ``.cache``; converted into the battery's folder when neither has it)."""

        def make():
            target = self.shared / SMOLLM2_DIR
            source = Path(os.environ.get("REPLACEME_CACHE", ROOT / ".cache")) / SMOLLM2_DIR
            if (source / "config.json").is_file():
                shutil.copytree(source, target)
            else:  # converted here, quietly (about 20 s)
                env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
                code = "from replaceme_exp.models.embedded import embedded_checkpoint as e; import sys; e(sys.argv[1])"
                subprocess.run([sys.executable, "-c", code, self.shared], check=True, env=env, capture_output=True)
            for f in target.iterdir():
                f.chmod(0o444)
            target.chmod(0o555)
            return target

        return self._once("model", make)

    def link_model(self, target: Path) -> None:
        """A folder of hard links to the shared conversion (a probe may delete or replace a file
        of its own copy; a write through a link fails: the files are read-only)."""
        source = self.model_dir()
        target.mkdir(parents=True, exist_ok=True)
        for f in source.iterdir():
            try:
                os.link(f, target / f.name)
            except OSError:
                shutil.copyfile(f, target / f.name)

    def checkpoints(self) -> Path:
        """``ckpt_a`` / ``ckpt_b`` (two random tiny Llamas of one shape, seeds 1 and 2) and
        ``ckpt_nan`` (a NaN in ``model.layers.2.mlp.down_proj.weight``), with SmolLM2's tokenizer."""

        def make():
            folder = self.shared / "checkpoints"
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            subprocess.run(
                [sys.executable, "-c", CHECKPOINT_SCRIPT, folder, self.model_dir()], check=True, env=env,
                capture_output=True,
            )  # fmt: skip
            return folder

        return self._once("checkpoints", make)

    def reference(self, name: str, *overrides: str) -> dict:
        """The finished row of a clean run of ``overrides`` (once per battery)."""

        def make():
            box = Sandbox(self, f"_ref_{name}")
            return require(box.job(*overrides), f"the clean run {name}")

        return self._once(f"ref:{name}", make)


# ---------------------------------------------------------------------------------------------
# Probes


@dataclass
class Probe:
    name: str
    category: str  # bad_input | fault | security
    run: Callable[[Sandbox], Verdict]
    item: str = ""  # what it tests (the wording where it has one)
    link_model: bool = True


PROBES: list[Probe] = []


def bad(
    name: str, overrides: list[str], mentions: list[str], item: str = "", files=None, prepare=None, config_dir=None
):
    """A bad input: ``files`` (name -> bytes) written under ``{files}`` first, ``prepare(box)`` run
    first, ``config_dir`` passed as ``--config-dir``; ``mentions``: what a clear refusal names (any one)."""

    def run(box: Sandbox) -> Verdict:
        for file, data in (files or {}).items():
            box.write(file, data() if callable(data) else data)
        if prepare is not None:
            prepare(box)
        result = box.job(*overrides, config_dir=config_dir)
        return classify_bad_input(result.code, box.hide(result.output), box.hide(result.rows), mentions)

    PROBES.append(Probe(name, "bad_input", run, item))


def probe(category: str, item: str = "", link_model: bool = True):
    def register(function: Callable[[Sandbox], Verdict]):
        PROBES.append(Probe(function.__name__, category, function, item, link_model))
        return function

    return register


# --- file contents ---------------------------------------------------------------------------

BINARY = bytes(range(256)) * 64
NON_UTF8 = ("Caf\xe9 cr\xe8me br\xfbl\xe9e, une phrase en Latin-1.\n\n" * 200).encode("latin-1")
NUL_TEXT = ("Some text with a NUL\x00 byte inside it.\n\n" * 200).encode()
PROSE = "".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog again and again.\n\n" for i in range(400))


def png(width: int, height: int, noise: bool = False) -> bytes:
    """A 1-bit greyscale PNG, all black (compressed as it is streamed: a 20000 x 20000 image is
    about 60 kB) or seeded noise (incompressible: cut short, it is a truncated image)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    width_bytes = (width + 7) // 8
    noise_bytes = hashlib.shake_256(b"battery").digest(width_bytes * height) if noise else b""
    packer = zlib.compressobj(9)
    lines = (
        b"\x00" + (noise_bytes[i * width_bytes : (i + 1) * width_bytes] if noise else bytes(width_bytes))
        for i in range(height)
    )
    idat = b"".join(packer.compress(line) for line in lines) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def nested_jsonl(depth: int = 100_000) -> bytes:
    return b'{"text": ' + b"[" * depth + b"]" * depth + b"}\n"


def readonly(*relative: str, results: bool = False):
    """``prepare``: make folders read-only (under the results folder with ``results``, else under files)."""

    def prepare(box: Sandbox) -> None:
        for rel in relative:
            path = (box.results if results else box.files) / rel
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o555)

    return prepare


def unreadable_file(name: str, data: bytes):
    def prepare(box: Sandbox) -> None:
        box.write(name, data).chmod(0o000)

    return prepare


TEXT_FILE = ["calibration=text_file", "calibration.path={files}/calib.txt"]
JSONL = ["calibration=jsonl", "calibration.path={files}/calib.jsonl"]
SELF_GENERATED = [
    "calibration=self_generated", "calibration.n_samples=8", "calibration.max_new_tokens=8",
    "calibration.generation_batch_size=8", "calibration.seq_len=64",
]  # fmt: skip
CLIP = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline", "calibration.n_samples=16"]
IMAGE_FOLDER = ["model=tiny_clip", "calibration=image_folder", "calibration.path={files}/images", "eval=clip_offline",
                "calibration.n_samples=4"]  # fmt: skip
LOCAL = ["model=smollm2_135m", "model.source=local", "model.name=local_tiny"]
SMOLLM2 = [  # no statistics to capture (identity): load, baseline, prune, evaluate
    "model=smollm2_135m", "objective=identity", "cuts=[[20,22]]", "calibration.n_samples=4", "calibration.seq_len=32",
    "eval.seq_len=32", "eval.max_windows=1",
]  # fmt: skip

# --- bad inputs the issue lists: accepted silently ---------------------------------------------
ACCEPTED = "accepted silently"
bad("experiment_typo", ["experiment=uidl_basline"], ["uidl_basline"], ACCEPTED)
bad("unknown_key_plus", ["+nonexistent=1"], ["nonexistent"], ACCEPTED)
bad("misspelled_group_plus", ["+calibratoin.n_samples=8"], ["calibratoin"], ACCEPTED)
bad("paper_template_without_m", ["+paper=structured_lts"], ["-m", "multirun", "sweep"], ACCEPTED)
bad("cuts_with_n_prune", ["cuts=[[1,3]]", "n_prune=4"], ["n_prune"], ACCEPTED)
bad("cuts_with_num_lts", ["cuts=[[1,3]]", "num_lts=2"], ["num_lts"], ACCEPTED)
bad("device_map_bogus", ["model.device_map=bogus"], ["device_map", "bogus"], ACCEPTED)
bad(
    "orthonormal_with_alpha",
    ["structure=orthonormal", "regularizer=l2", "alpha=10"],
    ["alpha", "orthonormal"],
    ACCEPTED,
)
bad(
    "seq_len_beyond_positions",
    ["calibration.seq_len=4096", "calibration.n_samples=4"],
    ["seq_len", "2048", "position"],
    ACCEPTED,
)
CLIP_WITH_SAMPLES = (  # an eval option of the user's: the CLIP benchmarks, and text generation samples
    b"defaults:\n  - clip_offline\n  - _self_\nname: clip_with_samples\n"
    b"samples:\n  prompts: [Hello]\n  max_new_tokens: 4\n"
)
bad("text_samples_for_vision", [*CLIP, "eval=clip_with_samples"], ["samples"], ACCEPTED,
    {"configs/eval/clip_with_samples.yaml": CLIP_WITH_SAMPLES}, config_dir="{files}/configs")  # fmt: skip

# --- before the model loads -------------------------------------------------------------------
BEFORE = "before the model loads"
bad("calib_binary_file", TEXT_FILE, ["calib.txt"], BEFORE, {"calib.txt": BINARY})
bad("calib_non_utf8", TEXT_FILE, ["calib.txt"], BEFORE, {"calib.txt": NON_UTF8})
bad("calib_nul_bytes", TEXT_FILE, ["calib.txt"], BEFORE, {"calib.txt": NUL_TEXT})
bad("calib_empty_file", TEXT_FILE, ["calib.txt"], BEFORE, {"calib.txt": b""})
bad("calib_too_little_text", TEXT_FILE, ["calib.txt", "n_samples"], BEFORE, {"calib.txt": b"one short paragraph\n"})
bad("jsonl_malformed", JSONL, ["calib.jsonl"], BEFORE, {"calib.jsonl": b'{"text": "fine"}\n{"text": broken\n'})
bad("jsonl_wrong_field", JSONL, ["text_field", "calib.jsonl"], BEFORE, {"calib.jsonl": b'{"foo": "a record"}\n' * 40})
bad("jsonl_empty", JSONL, ["calib.jsonl"], BEFORE, {"calib.jsonl": b""})
bad("jsonl_not_objects", JSONL, ["calib.jsonl"], BEFORE, {"calib.jsonl": b"1\n2\n3\n"})
bad("jsonl_non_utf8", JSONL, ["calib.jsonl"], BEFORE, {"calib.jsonl": b'{"text": "caf\xe9"}\n' * 40})
bad("jsonl_unknown_role", JSONL, ["chat_field", "role", "calib.jsonl"], BEFORE,
    {"calib.jsonl": b'{"messages": [{"role": "wizard", "content": "hi"}]}\n' * 40})  # fmt: skip
bad("prompts_non_utf8", [*SELF_GENERATED, "calibration.prompts_path={files}/prompts.txt"], ["prompts.txt"], BEFORE,
    {"prompts.txt": NON_UTF8})  # fmt: skip
bad("prompts_empty", [*SELF_GENERATED, "calibration.prompts_path={files}/prompts.txt"], ["prompts.txt"], BEFORE,
    {"prompts.txt": b"\n\n"})  # fmt: skip
bad("prompts_jsonl_no_prompt_field", [*SELF_GENERATED, "calibration.prompts_path={files}/prompts.jsonl"],
    ["prompts.jsonl"], BEFORE, {"prompts.jsonl": b'{"question": "why?"}\n' * 20})  # fmt: skip
bad("prompts_too_few", [*SELF_GENERATED, "calibration.prompts_path={files}/prompts.txt"], ["n_samples", "prompts"],
    BEFORE, {"prompts.txt": b"one prompt\n"})  # fmt: skip
bad("image_folder_empty", IMAGE_FOLDER, ["images"], BEFORE, {"images/readme.txt": b"no images here"})
bad("image_folder_undecodable", IMAGE_FOLDER, ["broken.png"], BEFORE,
    {"images/broken.png": b"\x89PNG\r\n\x1a\n" + BINARY})  # fmt: skip
bad("image_decompression_bomb", IMAGE_FOLDER, ["bomb.png"], BEFORE, {"images/bomb.png": lambda: png(20000, 20000)})
bad("cuts_overlapping", ["cuts=[[1,3],[2,4]]"], ["cuts", "overlap"], BEFORE)
bad("cuts_touching", ["cuts=[[1,3],[3,5]]", "merge_consecutive=false"], ["cuts", "touch"], BEFORE)
bad("cuts_beyond_depth", ["cuts=[[4,8]]"], ["cuts", "[4, 8]", "[4,8]"], BEFORE)
bad("num_lts_indivisible", ["n_prune=3", "num_lts=2"], ["num_lts", "n_prune"], BEFORE)
bad("n_prune_whole_depth", ["n_prune=6"], ["n_prune"], BEFORE)
bad("n_prune_beyond_depth", ["n_prune=100"], ["n_prune"], BEFORE)
bad("num_lts_too_many", ["n_prune=2", "num_lts=3"], ["num_lts"], BEFORE)
bad("tokenizer_bogus", ["model.tokenizer=bogus"], ["model.tokenizer", "bogus"], BEFORE)
bad("eval_paper_offline", ["eval=paper"], ["offline", "race", "winogrande", "piqa", "boolq", "hub"], BEFORE)
bad("healing_c4_offline", ["healing=lt_only", "healing.max_steps=2"], ["c4", "offline", "healing.data"], BEFORE)
bad(
    "calibration_hub_offline_c4",
    ["calibration=c4", "calibration.n_samples=8"],
    ["c4", "offline", "calibration"],
    BEFORE,
)
bad("results_runs_readonly", [], ["results", "runs", "writable"], BEFORE, prepare=readonly("runs", results=True))
bad("results_baselines_readonly", [], ["baselines", "writable"], BEFORE, prepare=readonly("baselines", results=True))
bad("results_models_readonly", ["save_model=true"], ["models", "writable"], BEFORE,
    prepare=readonly("models", results=True))  # fmt: skip
bad("stats_cache_dir_is_file", ["capture.cache_dir={files}/stats"], ["capture.cache_dir", "stats"], BEFORE,
    {"stats": b"a file, not a folder"})  # fmt: skip

# --- no traceback for a user's mistake --------------------------------------------------------
NO_TB = "no traceback"
bad("seed_huge", ["seed=99999999999999999999999"], ["seed"], NO_TB)
bad("n_samples_1e26", ["calibration.n_samples=1e26"], ["n_samples"], NO_TB)
bad("env_interpolation_missing", ["alpha=${oc.env:REPLACEME_BATTERY_UNSET}"], ["REPLACEME_BATTERY_UNSET", "alpha"],
    NO_TB)  # fmt: skip
bad("interpolation_recursive", ["alpha=${alpha}"], ["alpha", "recurs"], NO_TB)
bad("interpolation_missing_key", ["alpha=${no_such_key}"], ["no_such_key"], NO_TB)
bad("calib_unreadable_file", TEXT_FILE, ["calib.txt"], NO_TB, prepare=unreadable_file("calib.txt", PROSE.encode()))
bad("calib_path_is_folder", ["calibration=text_file", "calibration.path={files}"], ["calibration.path"], NO_TB)
bad("jsonl_deeply_nested", JSONL, ["calib.jsonl"], NO_TB, {"calib.jsonl": nested_jsonl})
bad("prompts_unreadable", [*SELF_GENERATED, "calibration.prompts_path={files}/prompts.txt"], ["prompts.txt"], NO_TB,
    prepare=unreadable_file("prompts.txt", b"a prompt\n"))  # fmt: skip
bad("image_undecodable_jpg", IMAGE_FOLDER, ["broken.jpg"], NO_TB, {"images/broken.jpg": b"\xff\xd8\xff" + BINARY})
bad(
    "image_truncated_png",
    IMAGE_FOLDER,
    ["cut.png"],
    NO_TB,
    {"images/cut.png": lambda: png(256, 256, noise=True)[:4000]},
)
bad("checkpoint_garbage_config", [*LOCAL, "model.pretrained={files}/ckpt"], ["ckpt", "config.json"], NO_TB,
    {"ckpt/config.json": b"{not json", "ckpt/model.safetensors": b"\x00" * 64})  # fmt: skip
bad("checkpoint_truncated_weights", [*LOCAL, "model.pretrained={files}/ckpt"], ["ckpt", "safetensors"], NO_TB,
    prepare=lambda box: _truncated_checkpoint(box))  # fmt: skip
bad("checkpoint_unknown_model_type", [*LOCAL, "model.pretrained={files}/ckpt"], ["ckpt", "model_type", "nosuch"],
    NO_TB, {"ckpt/config.json": b'{"model_type": "nosuch"}', "ckpt/model.safetensors": b"\x00" * 64})  # fmt: skip
bad(
    "checkpoint_missing", [*LOCAL, "model.pretrained={files}/nothing_here"], ["nothing_here", "model.pretrained"], NO_TB
)
bad("shape_heads_not_dividing", ["model.config.hidden_size=66"], ["hidden_size", "num_attention_heads"], NO_TB)
bad("shape_zero_layers", ["model.config.num_hidden_layers=0"], ["num_hidden_layers", "layers"], NO_TB)
bad("shape_negative_width", ["model.config.intermediate_size=-5"], ["intermediate_size"], NO_TB)
bad("nan_weights", [*LOCAL, "model.pretrained={dir}/../_shared/checkpoints/ckpt_nan"], ["down_proj", "nan"], NO_TB,
    prepare=lambda box: box.battery.checkpoints())  # fmt: skip
bad("results_dir_readonly", ["results_dir={files}/ro/results"], ["results_dir", "writable"], NO_TB,
    prepare=readonly("ro"))  # fmt: skip
bad("cache_dir_readonly", ["cache_dir={files}/ro/cache"], ["cache_dir", "writable"], NO_TB, prepare=readonly("ro"))

# --- more plausible bad inputs ----------------------------------------------------------------
MORE = "plausible bad input"
for _name, _overrides, _mentions in [
    ("n_prune_negative", ["n_prune=-1"], ["n_prune"]),
    ("n_prune_zero", ["n_prune=0"], ["n_prune"]),
    ("n_prune_fraction_over_one", ["n_prune=1.5"], ["n_prune"]),
    ("alpha_negative", ["regularizer=l2", "alpha=-1"], ["alpha"]),
    ("alpha_nan", ["regularizer=l2", "alpha=nan"], ["alpha"]),
    ("num_lts_zero", ["num_lts=0"], ["num_lts"]),
    ("cuts_start_zero", ["cuts=[[0,2]]"], ["cuts"]),
    ("cuts_reversed", ["cuts=[[4,2]]"], ["cuts"]),
    ("cuts_triple", ["cuts=[[1,2,3]]"], ["cuts"]),
    ("n_samples_zero", ["calibration.n_samples=0"], ["n_samples"]),
    ("n_samples_beyond_source", ["calibration.n_samples=100000"], ["n_samples"]),
    ("eval_seq_len_beyond_positions", ["eval.seq_len=100000"], ["eval.seq_len", "2048", "position"]),
    ("mask_ratio_over_one", ["mask_ratio=1.5"], ["mask_ratio"]),
    ("objective_unknown", ["objective=bogus"], ["objective", "bogus"]),
    ("model_unknown", ["model=bogus"], ["model", "bogus"]),
    ("lt_placement_unknown", ["lt_placement=bogus"], ["lt_placement"]),
    ("results_dir_is_file", ["results_dir={files}/afile"], ["results_dir", "afile"]),
    ("dtype_unknown", ["model.dtype=float13"], ["model.dtype", "float13"]),
    ("device_cuda_without_gpu", ["model.device=cuda"], ["model.device", "cuda"]),
    ("solver_unknown", ["objective=cosine", "objective.solver=bogus"], ["solver", "bogus"]),
    (
        "evaluate_missing_checkpoint",
        ["job=evaluate", "evaluate.checkpoint={files}/missing"],
        ["evaluate.checkpoint", "missing"],
    ),
    ("eval_text_file_missing", ["eval.text=text_file", "eval.path={files}/missing.txt"], ["eval.path", "missing.txt"]),
    (
        "calib_text_file_missing",
        ["calibration=text_file", "calibration.path={files}/missing.txt"],
        ["calibration.path"],
    ),
    ("text_data_for_vision_model", ["model=tiny_clip", "eval=clip_offline"], ["calibration", "vision"]),
    (
        "healing_text_file_missing",
        ["healing=lora", "healing/data=text_file", "healing.data.path={files}/none.txt"],
        ["healing.data.path"],
    ),
    ("samples_override_of_null_node", [*CLIP, "eval.samples.prompts=[Hello]"], ["eval.samples"]),
    ("capture_4bit_on_cpu", ["model.capture_4bit=true"], ["capture_4bit"]),
    ("estimation_first_beyond_seq_len", ["estimation=skip_first", "estimation.first=1000"], ["estimation.first"]),
]:
    bad(_name, _overrides, _mentions, MORE, files={"afile": b"x"} if "afile" in str(_overrides) else None)


def _truncated_checkpoint(box: Sandbox) -> None:
    source = box.battery.checkpoints() / "ckpt_a"
    target = box.files / "ckpt"
    shutil.copytree(source, target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])


# --- faults -----------------------------------------------------------------------------------
WRONG = "wrong finished rows"
DEBRIS = "debris"
HELD = "held in round one"


def _stats_files(box: Sandbox, kind: str) -> set[str]:
    return snapshot(box.cache / "stats", f"{kind}-*.pt")


def _fresh(box: Sandbox, n: int) -> Path:
    return box.dir / f"results{n}"


def _cache_swap(box: Sandbox, kind: str, victim: list[str], donor: list[str]) -> Verdict:
    """Run ``victim`` (clean), then ``donor``; copy the donor's new ``kind`` entry over the
    victim's; run ``victim`` again with a fresh results folder (the cache is shared)."""
    before = _stats_files(box, kind)
    clean = require(box.job(*victim), "the victim's clean run")
    victim_files = _stats_files(box, kind) - before
    require(box.job(*donor), "the donor's run")
    donor_files = _stats_files(box, kind) - before - victim_files
    if len(victim_files) != 1 or len(donor_files) != 1:
        raise ProbeError(f"expected one new {kind} entry each, got {len(victim_files)} and {len(donor_files)}")
    shutil.copyfile(donor_files.pop(), victim_files.pop())
    again = box.job(*victim, results=_fresh(box, 2))
    row = finished(again)
    diffs = None if row is None else row_differences(clean, row)
    return classify_fault(diffs, again.output, note=_warned(again))


def _warned(run: Run) -> str:
    warnings = [w for w in warning_lines(run.output) if "cache" in w.lower() or "fingerprint" in w.lower()]
    return "warned" if warnings else "no warning"


@probe("fault", WRONG + ": a valid selection-distance entry of another cut length copied over this one")
def cache_swap_selection_distances(box: Sandbox) -> Verdict:
    return _cache_swap(box, "distances", ["n_prune=2"], ["n_prune=3"])


@probe("fault", WRONG + ": a valid statistics entry of another cut copied over this one")
def cache_swap_statistics(box: Sandbox) -> Verdict:
    return _cache_swap(box, "linear", ["cuts=[[1,3]]"], ["cuts=[[2,4]]"])


@probe("fault", WRONG + ": another model's baseline file copied over this one's")
def cache_swap_baseline(box: Sandbox) -> Verdict:
    baselines = box.results / "baselines"
    before = snapshot(baselines, "*.json")
    clean_run = box.job("cuts=[[1,3]]")
    clean = require(clean_run, "the clean run")
    mine = {json.loads(Path(p).read_text())["key"].get("metric"): p for p in snapshot(baselines, "*.json") - before}
    middle = snapshot(baselines, "*.json")
    require(box.job("cuts=[[1,3]]", "model.init_seed=7"), "the other model's run")
    theirs = {json.loads(Path(p).read_text())["key"].get("metric"): p for p in snapshot(baselines, "*.json") - middle}
    metric = next((m for m in mine if m in theirs and "ppl" in str(m)), None)
    if metric is None:
        raise ProbeError(
            f"no perplexity baseline entries to swap ({sorted(map(str, mine))} / {sorted(map(str, theirs))})"
        )
    shutil.copyfile(theirs[metric], mine[metric])
    shutil.rmtree(box.results / "runs" / clean["config_hash"])  # the row, not the baselines, goes
    again = box.job("cuts=[[1,3]]")
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output, note=_warned(again))


def _generated_file(box: Sandbox) -> Path:
    files = sorted((box.cache / "generated").glob("*.json"))
    if len(files) != 1:
        raise ProbeError(f"expected one generated calibration file, found {len(files)}")
    return files[0]


def _tamper_generated(box: Sandbox, change: Callable[[dict], dict]) -> Verdict:
    clean = require(box.job(*SELF_GENERATED), "the clean self-generated run")
    path = _generated_file(box)
    entry = json.loads(path.read_text())
    if isinstance(entry.get("value"), dict):  # a keyed entry: the answers are its value (its checksum left stale)
        entry["value"] = change(entry["value"])
    else:
        entry = change(entry)
    path.write_text(json.dumps(entry))
    again = box.job(*SELF_GENERATED, results=_fresh(box, 2))
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output, note=_warned(again))


@probe("fault", WRONG + ": 5 of 8 self-generated answers dropped from the cache")
def selfgen_answers_dropped(box: Sandbox) -> Verdict:
    return _tamper_generated(box, lambda d: {**d, "answers": d["answers"][:3]})


@probe("fault", WRONG + ": the self-generated answers edited in the cache")
def selfgen_answers_edited(box: Sandbox) -> Verdict:
    return _tamper_generated(box, lambda d: {**d, "answers": ["edited " * 20 for _ in d["answers"]]})


@probe("fault", WRONG + ": the image calibration cache entry tampered with (pixels negated)")
def image_cache_tampered(box: Sandbox) -> Verdict:
    clean = require(box.job(*CLIP), "the clean CLIP run")
    files = sorted((box.cache / "images").glob("*.pt"))  # the calibration images and the held-out ones
    if not files:
        raise ProbeError("no image cache entry")
    code = (
        "import torch,sys\nfor p in sys.argv[1:]:\n"
        "    e = torch.load(p, weights_only=True)\n"
        "    torch.save({**e, 'pixels': -e['pixels']} if isinstance(e, dict) else -e, p)"
    )
    subprocess.run([sys.executable, "-c", code, *files], check=True, capture_output=True)
    again = box.job(*CLIP, results=_fresh(box, 2))
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output, note=_warned(again))


def _own_model_file(box: Sandbox, name: str) -> Path:
    """Replace the link to the shared conversion's ``name`` by a writable copy."""
    path = box.cache / SMOLLM2_DIR / name
    path.unlink()
    shutil.copyfile(box.battery.model_dir() / name, path)
    path.chmod(0o644)
    return path


@probe("fault", WRONG + ": the converted SmolLM2's weights changed (same fingerprint)")
def embedded_weights_changed(box: Sandbox) -> Verdict:
    weights = _own_model_file(box, "model.safetensors")
    clean = require(box.job(*SMOLLM2), "the clean SmolLM2 run")
    import numpy as np

    with open(weights, "r+b") as f:
        header = struct.unpack("<Q", f.read(8))[0]
        size = weights.stat().st_size
        offset = 8 + header + ((size - 8 - header) // 2) // 4 * 4
        f.seek(offset)
        values = np.frombuffer(f.read(2**24), dtype=np.float32) * 1.5
        f.seek(offset)
        f.write(values.astype(np.float32).tobytes())
    again = box.job(*SMOLLM2, results=_fresh(box, 2))
    row = finished(again)
    refused = row is None and names_any(refusal_line(again.output, again.rows), ["model.safetensors", SMOLLM2_DIR])
    diffs = None if row is None else row_differences(clean, row)
    return classify_fault(diffs, again.output, refused_clearly=refused, note=_warned(again))


@probe("fault", WRONG + ": a flipped byte in the converted SmolLM2's tokenizer.json")
def embedded_tokenizer_flipped(box: Sandbox) -> Verdict:
    clean = box.battery.reference("tiny", "cuts=[[1,3]]")
    path = _own_model_file(box, "tokenizer.json")
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    again = box.job("cuts=[[1,3]]")
    row = finished(again)
    refused = row is None and names_any(refusal_line(again.output, again.rows), ["tokenizer.json"])
    diffs = None if row is None else row_differences(clean, row)
    return classify_fault(diffs, again.output, refused_clearly=refused, note=_warned(again))


def _local(box: Sandbox, path: Path, *extra: str) -> list[str]:
    return [*LOCAL, f"model.pretrained={path}", "cuts=[[1,3]]", *extra]


@probe("fault", WRONG + ": a weight-fingerprint memo of checkpoint B rewritten to A's digest")
def fingerprint_memo_tampered(box: Sandbox) -> Verdict:
    ckpts = box.battery.checkpoints()
    a, b = box.files / "a", box.files / "b"
    shutil.copytree(ckpts / "ckpt_a", a)
    shutil.copytree(ckpts / "ckpt_b", b)
    memos = box.cache / "fingerprints"
    require(box.job(*_local(box, a)), "checkpoint A's run")
    before = {str(m) for m in memos.rglob("*")}
    clean_b = require(box.job(*_local(box, b)), "checkpoint B's run")
    sha = lambda f: hashlib.sha256(f.read_bytes()).hexdigest()
    swaps = {sha(b / f.name): sha(f) for f in a.iterdir() if f.is_file() and sha(f) != sha(b / f.name)}
    changed = 0
    for memo in (m for m in memos.rglob("*") if m.is_file() and str(m) not in before):
        text = memo.read_text(errors="replace")
        for mine, theirs in swaps.items():
            if mine in text:  # a memo of B's file: it now says A's digest
                memo.write_text(text.replace(mine, theirs))
                changed += 1
    if not changed:
        raise ProbeError("found no memo of checkpoint B's weights to tamper with")
    again = box.job(*_local(box, b))
    row = finished(again)
    if row is None and skipped_run_id(again):
        row = next((r for r in read_rows(box.results).values() if r.get("run_id") == skipped_run_id(again)), None)
    return classify_fault(None if row is None else row_differences(clean_b, row), again.output)


@probe("fault", WRONG + ": a checkpoint rewritten in place with the same size, inode and mtime")
def checkpoint_rewritten_same_stat(box: Sandbox) -> Verdict:
    ckpts = box.battery.checkpoints()
    model = box.files / "model"
    shutil.copytree(ckpts / "ckpt_a", model)
    require(box.job(*_local(box, model)), "the run on checkpoint A")
    clean_b = box.battery.reference("local_b", *_local(box, ckpts / "ckpt_b"))
    weights = model / "model.safetensors"
    stat = weights.stat()
    other = (ckpts / "ckpt_b" / "model.safetensors").read_bytes()
    if len(other) != stat.st_size:
        raise ProbeError("checkpoints A and B differ in size")
    with open(weights, "r+b") as f:
        f.write(other)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    again = box.job(*_local(box, model))
    if skipped_run_id(again):
        return Verdict("not", "skipped with checkpoint A's row", wrong_finished_row=True)
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean_b, row), again.output)


@probe("fault", WRONG + ": clock skew: the first run's started_at is a day ahead, then a forced rerun")
def clock_skew_forced_rerun(box: Sandbox) -> Verdict:
    import pandas as pd

    first = require(box.job("save_model=true"), "the first run")
    path = box.results / "runs" / first["config_hash"] / f"{first['run_id']}.parquet"
    table = pd.read_parquet(path)
    ahead = pd.Timestamp(table.loc[0, "started_at"]) + pd.Timedelta(days=1)
    table.loc[0, "started_at"] = ahead.isoformat()
    table.to_parquet(path, index=False)
    rerun = require(box.job("save_model=true", "force=true"), "the forced rerun")
    shown = box.job("save_model=true")
    shown_id = skipped_run_id(shown)
    saved = box.results / "models" / rerun["config_hash"] / "replaceme.json"
    saved_id = json.loads(saved.read_text()).get("run_id") if saved.is_file() else None
    if shown_id != rerun["run_id"]:
        note = f"the store shows run {shown_id}, the forced rerun was {rerun['run_id']}, the saved model {saved_id}"
        return Verdict("not", note, wrong_finished_row=True)
    return classify_fault([], shown.output)


def _model_folder(box: Sandbox, row: dict) -> Path:
    return box.results / "models" / row["config_hash"]


def _model_whole(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _broken_model(box: Sandbox, damage: Callable[[Path], None]) -> Verdict:
    first = require(box.job("save_model=true"), "the first run")
    folder = _model_folder(box, first)
    damage(folder)
    again = box.job("save_model=true")
    whole = _model_whole(folder) and all(f.stat().st_size > 1000 for f in folder.glob("*.safetensors"))
    if skipped_run_id(again):
        return Verdict("not", "skipped: the finished row points at a broken model", wrong_finished_row=True)
    row = finished(again)
    if row is not None and not whole:
        return Verdict("not", "ran again but the model is still broken")
    return classify_fault(None if row is None else row_differences(first, row), again.output)


@probe("fault", WRONG + ": the finished model's weight files deleted (folder kept)")
def model_weights_deleted(box: Sandbox) -> Verdict:
    return _broken_model(box, lambda folder: [f.unlink() for f in folder.glob("*.safetensors")])


@probe("fault", "a skip must check the model is whole: the weights truncated")
def model_weights_truncated(box: Sandbox) -> Verdict:
    def damage(folder: Path) -> None:
        for f in folder.glob("*.safetensors"):
            os.truncate(f, 100)

    return _broken_model(box, damage)


@probe("fault", "a skip must check the model is whole: config.json deleted")
def model_config_deleted(box: Sandbox) -> Verdict:
    return _broken_model(box, lambda folder: (folder / "config.json").unlink())


@probe("fault", HELD + ": a statistics entry truncated")
def stats_entry_truncated(box: Sandbox) -> Verdict:
    clean = require(box.job("cuts=[[1,3]]"), "the clean run")
    for f in (box.cache / "stats").glob("linear-*.pt"):
        os.truncate(f, f.stat().st_size // 2)
    again = box.job("cuts=[[1,3]]", results=_fresh(box, 2))
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output, note=_warned(again))


@probe("fault", HELD + ": a flipped byte in a selection-distance entry")
def stats_entry_flipped(box: Sandbox) -> Verdict:
    clean = require(box.job(), "the clean run")
    for f in (box.cache / "stats").glob("distances-*.pt"):
        data = bytearray(f.read_bytes())
        data[len(data) * 3 // 4] ^= 0x10
        f.write_bytes(bytes(data))
    again = box.job(results=_fresh(box, 2))
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output, note=_warned(again))


@probe("fault", HELD + ": a baseline entry with a flipped digit")
def baseline_entry_flipped(box: Sandbox) -> Verdict:
    clean = require(box.job("cuts=[[1,3]]"), "the clean run")
    for f in (box.results / "baselines").glob("*.json"):
        f.write_text(re.sub(r"(\"value\": -?\d+\.\d)(\d)", lambda m: m.group(1) + str((int(m.group(2)) + 1) % 10),
                            f.read_text(), count=1))  # fmt: skip
    shutil.rmtree(box.results / "runs")
    again = box.job("cuts=[[1,3]]")
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output, note=_warned(again))


@probe("fault", HELD + ": the finished row file truncated: the job runs again")
def row_file_truncated(box: Sandbox) -> Verdict:
    clean = require(box.job("cuts=[[1,3]]"), "the clean run")
    path = box.results / "runs" / clean["config_hash"] / f"{clean['run_id']}.parquet"
    os.truncate(path, path.stat().st_size // 2)
    again = box.job("cuts=[[1,3]]")
    row = finished(again)
    return classify_fault(None if row is None else row_differences(clean, row), again.output)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@probe("fault", DEBRIS + ": leftover temporary row and statistics files of a killed job, then the same job")
def leftover_temporary_files(box: Sandbox) -> Verdict:
    first = require(box.job("cuts=[[1,3]]"), "the first run")
    pid = _dead_pid()
    # named as atomic_path names them (the writer's pid and host); older code wrote no host
    host = "@" + (re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host")
    planted = [
        box.results / "runs" / first["config_hash"] / f".{first['run_id']}x.parquet.{pid}{host}.tmp",
        box.cache / "stats" / f".linear-0123456789abcdef01234567.pt.{pid}{host}.tmp",
        box.results / "baselines" / f".0123456789abcdef01234567.json.{pid}{host}.tmp",
    ]
    for path in planted:
        path.write_bytes(b"half a file")
    again = box.job("cuts=[[1,3]]", "force=true")
    row = finished(again)
    left = [str(p.relative_to(box.dir)) for p in planted if p.exists()]
    return classify_fault(None if row is None else row_differences(first, row), again.output, debris=left)


def _killed_at(text: str) -> Callable[[str], bool]:
    return lambda output: text in output


@probe("fault", DEBRIS + ": kill -9 during the model save, then the same job")
def kill9_during_save(box: Sandbox) -> Verdict:
    killed = box.job("save_model=true", kill_when=_killed_at("stage save ..."))
    if killed.code is not None and killed.code >= 0 and finished(killed):
        raise ProbeError("the job finished before the kill")
    again = box.job("save_model=true")
    row = finished(again)
    whole = row is not None and _model_whole(_model_folder(box, row))
    debris = leftovers(box.results, box.cache)
    return classify_fault([] if row else None, again.output, debris=debris, model_lost=row is not None and not whole)


@probe("fault", HELD + ": kill -9 during the save of a forced rerun: a whole model stays")
def kill9_during_forced_rerun_save(box: Sandbox) -> Verdict:
    first = require(box.job("save_model=true"), "the first run")
    folder = _model_folder(box, first)
    box.job("save_model=true", "force=true", kill_when=_killed_at("stage save ..."))
    after_kill = _model_whole(folder) or any(
        _model_whole(p / "model") for p in folder.parent.glob(f".old-{folder.name}-*")
    )
    again = box.job("save_model=true")
    whole = _model_whole(folder)
    row = finished(again) or (first if skipped_run_id(again) else None)
    debris = leftovers(box.results)
    note = "" if after_kill else "no whole model right after the kill"
    return classify_fault([] if row else None, again.output, debris=debris, model_lost=not whole, note=note)


@probe("fault", DEBRIS + ": kill -9 during the SmolLM2 conversion, then the same job", link_model=False)
def kill9_during_conversion(box: Sandbox) -> Verdict:
    def converting(_output: str) -> bool:
        partial = [p for p in box.cache.glob(".convert-*") if p.is_dir()]
        return any(f.stat().st_size > 2**24 for p in partial for f in p.glob("*"))

    killed = box.job(kill_when=converting)
    if killed.code == 0:
        raise ProbeError("the conversion finished before the kill")
    left_after_kill = leftovers(box.cache)
    again = box.job()
    row = finished(again)
    debris = leftovers(box.cache)
    note = f"after the kill: {', '.join(left_after_kill)[:80]}" if left_after_kill else "nothing left after the kill"
    return classify_fault([] if row else None, again.output, debris=debris, note=note)


@probe("fault", DEBRIS + ": the converted-model folder is readable by other users (not 0700)", link_model=False)
def converted_model_permissions(box: Sandbox) -> Verdict:
    run = box.job()
    require(run, "the converting run")
    mode = (box.cache / SMOLLM2_DIR).stat().st_mode & 0o777
    files = {f.name: f.stat().st_mode & 0o777 for f in (box.cache / SMOLLM2_DIR).iterdir()}
    private = [name for name, m in files.items() if not m & 0o044]
    if not mode & 0o055 or private:
        return Verdict("not", f"folder mode {mode:o}; private files: {', '.join(private) or 'none'}")
    return Verdict("survived", f"folder mode {mode:o}")


@probe("fault", DEBRIS + ": make clean-cache removes the statistics under REPLACEME_CACHE")
def clean_cache_follows_replaceme_cache(box: Sandbox) -> Verdict:
    stats = box.cache / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    planted = stats / "linear-0123456789abcdef01234567.pt"
    planted.write_bytes(b"stale")
    save = box.results / "models" / ".save-0123456789abcdef-x"
    save.mkdir(parents=True)
    run = box.call(["make", "-f", ROOT / "Makefile", "clean-cache", f"RESULTS={box.results}"])
    left = [str(p.relative_to(box.dir)) for p in (planted, save) if p.exists()]
    if run.code != 0:
        return Verdict("not", f"make clean-cache failed (exit {run.code}): {last_exception(run.output)}")
    return classify_fault([], run.output, debris=left)


@probe("fault", HELD + ": SIGTERM mid-run: a row, exit 143, then the same job finishes")
def sigterm_mid_run(box: Sandbox) -> Verdict:
    # SIGTERM (not SIGKILL) to the job: run_process only sends SIGKILL, so signal it here.
    proc_env = box.env()
    log = box.dir / "sigterm.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [*PREFIX, sys.executable, ROOT / "run.py", *box.base(box.results, box.cache), "calibration.n_samples=64",
             "calibration.seq_len=128"], cwd=box.work, env=proc_env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        start = time.monotonic()
        while proc.poll() is None and time.monotonic() - start < RUN_TIMEOUT:
            if LOADED in log.read_text(errors="replace"):
                os.killpg(proc.pid, signal.SIGTERM)
                break
            time.sleep(0.05)
        code = proc.wait(timeout=RUN_TIMEOUT)
    output = log.read_text(errors="replace")
    rows = list(read_rows(box.results).values())
    again = box.job("calibration.n_samples=64", "calibration.seq_len=128")
    row = finished(again)
    problems = []
    if code == 0:
        raise ProbeError("the job finished before the signal")
    if code not in (143, -15):
        problems.append(f"exit {code}")
    if not rows:
        problems.append("no row for the stopped job")
    note = "; ".join(problems)
    verdict = classify_fault([] if row else None, output + again.output, note=note)
    if problems and verdict.outcome == "survived":
        verdict.outcome = "partly"
    return verdict


@probe("fault", "a full disk for the optional statistics cache: skipped with a warning, the job finishes")
def stats_cache_disk_full(box: Sandbox) -> Verdict:
    mount = box.dir / "full"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mount], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as err:
        raise ProbeError(f"no tmpfs mount ({err}): skipped") from err
    try:
        (mount / "filler").write_bytes(b"\0" * 60_000)
        (mount / "stats").mkdir()
        clean = box.battery.reference("tiny_default")
        run = box.job(f"capture.cache_dir={mount}/stats")
        row = finished(run)
        diffs = None if row is None else row_differences(clean, row)
        refused = row is None and names_any(refusal_line(run.output, run.rows), ["capture.cache_dir", "space", "full"])
        return classify_fault(diffs, run.output, refused_clearly=refused)
    finally:
        subprocess.run(["umount", "-l", mount], capture_output=True)


@probe("fault", HELD + ": junk row files fed to make report and render_paper")
def junk_rows_to_reports(box: Sandbox) -> Verdict:
    require(box.job(), "the clean run")
    junk = box.results / "runs" / "junk"
    junk.mkdir()
    (junk / "a.parquet").write_bytes(b"not parquet at all")
    (junk / "b.parquet").write_bytes(b"")
    report = box.call([sys.executable, "-m", "replaceme_exp.reporting.report", "--results", box.results])
    paper = box.call([sys.executable, "-m", "replaceme_exp.reporting.render_paper", "--results", box.results,
                      "--out", box.dir / "tables"])  # fmt: skip
    bad_runs = [r for r in (report, paper) if r.code != 0 or TRACEBACK in r.output]
    if bad_runs:
        return Verdict("not", f"exit {bad_runs[0].code}: {last_exception(bad_runs[0].output)}")
    return Verdict("survived")


# --- security ---------------------------------------------------------------------------------


def _make_injection(variable: str, value: str, target: str = "paper-tables") -> Callable[[Sandbox], Verdict]:
    def run(box: Sandbox) -> Verdict:
        marker = box.dir / "PWNED"
        box.results.mkdir(exist_ok=True)
        argv = ["make", "-f", ROOT / "Makefile", "-o", "setup", target, f"VENV={sys.prefix}",
                f"RESULTS={box.results}", f"{variable}={value.format(marker=marker)}"]  # fmt: skip
        if target == "report" and variable == "RESULTS":
            argv.pop(-2)
        box.call(argv, timeout=120)
        return Verdict("vulnerable", f"{variable} ran a command") if marker.exists() else Verdict("safe")

    return run


for _var, _value in [
    ("MODEL", "x; touch {marker}"),
    ("MODEL", "x'; touch {marker}; echo '"),
    ("MODEL", "x`touch {marker}`"),
    ("MODEL", "x$$(touch {marker})"),
    ("CALIBRATION", "x; touch {marker}"),
    ("EVAL", "x; touch {marker}"),
    ("PROTOCOL", "x; touch {marker}"),
    ("RESULTS", "x; touch {marker}"),
]:
    _quote = {"'": "quote", "`": "backtick", "$": "dollar"}
    _how = next((w for c, w in _quote.items() if c in _value), "semicolon")
    PROBES.append(Probe(f"make_paper_tables_{_var.lower()}_{_how}", "security", _make_injection(_var, _value),
                        "Make variables pasted into the recipe", link_model=False))  # fmt: skip
_report = _make_injection("RESULTS", "x; touch {marker}", "report")
PROBES.append(
    Probe(
        "make_report_results_semicolon", "security", _report, "Make variables pasted into the recipe", link_model=False
    )
)


def _files_outside(folder: Path, inside: Path, before: set[str]) -> list[str]:
    return sorted(
        str(Path(p).relative_to(folder)) for p in map(str, folder.rglob("*"))
        if p not in before and not p.startswith(str(inside)) and Path(p).is_file()
    )  # fmt: skip


def _traversal(column: str, retarget: list[str], command: str = "render_paper") -> Callable[[Sandbox], Verdict]:
    """A finished row whose ``column`` is ``../../../../ESCAPED_<column>``, rendered into a folder
    four levels down: any file written outside it is a traversal."""

    def run(box: Sandbox) -> Verdict:
        import pandas as pd

        clean = box.battery.reference("tiny_default")
        results = box.dir / "store"
        row = {k: v for k, v in clean.items()}
        row[column] = f"../../../../ESCAPED_{column}"
        path = results / "runs" / str(row["config_hash"]) / f"{row['run_id']}.parquet"
        path.parent.mkdir(parents=True)
        pd.DataFrame([row]).to_parquet(path, index=False)
        out = box.dir / "a" / "b" / "c" / "out"
        out.mkdir(parents=True)
        before = {str(p) for p in box.dir.rglob("*")}
        if command == "render_paper":
            argv = [sys.executable, "-m", "replaceme_exp.reporting.render_paper", "--results", results, "--out", out,
                    *retarget]  # fmt: skip
            inside = out
        else:
            argv = [sys.executable, "-m", "replaceme_exp.reporting.report", "--results", results]
            inside = results / "report"
        box.call(argv, results=results, timeout=120)
        outside = _files_outside(box.dir, inside, before)
        outside = [p for p in outside if not re.match(r"run\d+\.log$", p)]
        return Verdict("vulnerable", f"wrote {', '.join(outside)[:150]}") if outside else Verdict("safe")

    return run


for _column, _retarget in [
    ("calibration", ["--model", "tiny_llama"]),
    ("eval", ["--model", "tiny_llama"]),
    ("model", ["--model", "../../../../ESCAPED_model"]),
]:
    PROBES.append(Probe(f"path_traversal_render_paper_{_column}", "security", _traversal(_column, _retarget),
                        "row values that become paths", link_model=True))  # fmt: skip
for _column in ("sweep_id", "sweep_name", "sweep_group"):
    PROBES.append(Probe(f"path_traversal_report_{_column}", "security", _traversal(_column, [], "report"),
                        "row values that become paths", link_model=True))  # fmt: skip

TARGET = "_target_ in shared sweep files and templates"


def _config_dir_payload(box: Sandbox, group: str, text: str, name: str = "shared") -> Path:
    """A shared config folder (``--config-dir``) holding ``<group>/<name>.yaml``."""
    folder = box.files / "shared_configs"
    (folder / group).mkdir(parents=True, exist_ok=True)
    (folder / group / f"{name}.yaml").write_text(text)
    return folder


def _copy_node(box: Sandbox, indent: str, args_key: bool = True) -> str:
    """A ``_target_`` node that writes a file of the probe's choosing (``shutil.copyfile``: not on
    Hydra's own block list; writing any file is as good as running code) to ``<probe>/PWNED``."""
    source = box.write("payload.txt", "written by a config file\n")
    if args_key:
        return f"{indent}_target_: shutil.copyfile\n{indent}_args_: ['{source}', '{box.dir / 'PWNED'}']\n"
    return f"{indent}_target_: shutil.copyfile\n{indent}src: {source}\n{indent}dst: {box.dir / 'PWNED'}\n"


def _pwned(box: Sandbox, run: Run, what: str) -> Verdict:
    return Verdict("vulnerable", what) if (box.dir / "PWNED").exists() else Verdict("safe", _short(run))


@probe("security", TARGET + ": a Hydra callback in a shared sweep file (--config-dir)")
def target_callback_in_sweep_file(box: Sandbox) -> Verdict:
    text = "# @package _global_\nhydra:\n  callbacks:\n    shared:\n" + _copy_node(box, "      ")
    folder = _config_dir_payload(box, "sweeps", text)
    run = box.call([sys.executable, ROOT / "run.py", "--config-dir", folder, *box.base(box.results, box.cache),
                    "+sweeps=shared"])  # fmt: skip
    return _pwned(box, run, "the callback's _target_ ran")


@probe("security", TARGET + ": a shared launcher preset whose _target_ is not a launcher, with -m")
def target_launcher_preset(box: Sandbox) -> Verdict:
    folder = _config_dir_payload(box, "hydra/launcher", _copy_node(box, "", args_key=False))
    run = box.call([sys.executable, ROOT / "run.py", "-m", "--config-dir", folder,
                    *box.base(box.results, box.cache), "hydra/launcher=shared"])  # fmt: skip
    return _pwned(box, run, "the launcher's _target_ ran")


@probe("security", TARGET + ": an objective option whose _target_ imports an arbitrary module")
def target_objective_imports_module(box: Sandbox) -> Verdict:
    text = "# @package _global_\nobjective:\n  _target_: this.Estimator\n"
    folder = _config_dir_payload(box, "sweeps", text)
    run = box.call([sys.executable, ROOT / "run.py", "--config-dir", folder, *box.base(box.results, box.cache),
                    "+sweeps=shared"])  # fmt: skip
    imported = "Beautiful is better than ugly" in run.output
    return Verdict("vulnerable", "imported module `this`") if imported else Verdict("safe", _short(run))


@probe("security", HELD + ": a template of the same name in the working directory is not used")
def template_in_working_directory(box: Sandbox) -> Verdict:
    folder = box.work / "multirun_templates" / "paper"
    folder.mkdir(parents=True)
    text = "# @package _global_\nhydra:\n  callbacks:\n    shared:\n" + _copy_node(box, "      ")
    (folder / "structured_lts.yaml").write_text(text)
    run = box.job("+paper=structured_lts", timeout=120)
    return _pwned(box, run, "the working directory's template ran")


PICKLE_SCRIPT = r"""
import os, sys, torch
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
torch.save({"mtm": Payload()}, sys.argv[1])
"""


@probe("security", HELD + ": a malicious pickle as a statistics cache entry")
def malicious_pickle_in_cache(box: Sandbox) -> Verdict:
    marker = box.dir / "PWNED"
    require(box.job("cuts=[[1,3]]"), "the clean run")
    for f in (box.cache / "stats").glob("*.pt"):
        subprocess.run([sys.executable, "-c", PICKLE_SCRIPT, f, marker], check=True, capture_output=True)
    marker.unlink(missing_ok=True)
    run = box.job("cuts=[[1,3]]", results=_fresh(box, 2))
    return Verdict("vulnerable", "the pickle ran") if marker.exists() else Verdict("safe", _short(run))


@probe("security", HELD + ": a local checkpoint asking for remote code")
def remote_code_checkpoint(box: Sandbox) -> Verdict:
    marker = box.dir / "PWNED"
    model = box.files / "ckpt"
    shutil.copytree(box.battery.checkpoints() / "ckpt_a", model)
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "evil.py").write_text(f"import os\nos.system('touch {marker}')\n")
    run = box.job(*_local(box, model))
    return Verdict("vulnerable", "the checkpoint's code ran") if marker.exists() else Verdict("safe", _short(run))


def _short(run: Run) -> str:
    status = ",".join(sorted({str(r.get("status")) for r in run.rows})) or "no row"
    return f"exit {run.code}, {status}"


# ---------------------------------------------------------------------------------------------
# Running the battery


@dataclass
class Result:
    name: str
    category: str
    item: str
    outcome: str
    detail: str
    seconds: float
    after_load: bool = False
    no_row: bool = False
    wrong_finished_row: bool = False
    model_lost: bool = False
    commands: list = field(default_factory=list)


def run_probe(battery: Battery, p: Probe) -> Result:
    start = time.monotonic()
    box = None
    try:
        box = Sandbox(battery, p.name, link_model=p.link_model)
        verdict = p.run(box)
    except ProbeError as err:
        verdict = Verdict("probe_error", str(err))
    except Exception as err:  # noqa: BLE001 - a bug of the battery: reported, the others go on
        verdict = Verdict("probe_error", f"{type(err).__name__}: {err} ({traceback.format_exc().splitlines()[-3]})")
    commands = [
        " ".join(r.argv[1:] if r.argv and r.argv[0] == sys.executable else r.argv) for r in (box.runs if box else [])
    ]
    flags = (verdict.after_load, verdict.no_row, verdict.wrong_finished_row, verdict.model_lost)
    seconds = round(time.monotonic() - start, 1)
    return Result(p.name, p.category, p.item, verdict.outcome, verdict.detail, seconds, *flags, commands)


def figures(results: list[Result]) -> dict:
    def count(category, outcome=None, **flags):
        return sum(
            1 for r in results
            if r.category == category and (outcome is None or r.outcome == outcome)
            and all(getattr(r, k) == v for k, v in flags.items())
        )  # fmt: skip

    return {
        "bad_inputs": {
            "total": count("bad_input"),
            "refused_clearly": count("bad_input", "refused_clearly"),
            "refused_clearly_after_load": count("bad_input", "refused_clearly", after_load=True),
            "refused_unclearly": count("bad_input", "refused_unclearly"),
            "accepted_silently": count("bad_input", "accepted_silently"),
            "accepted_with_warning": count("bad_input", "accepted_with_warning"),
            "crashed_with_traceback": count("bad_input", "crashed"),
            "crashed_leaving_no_row": count("bad_input", "crashed", no_row=True),
            "probe_errors": count("bad_input", "probe_error"),
        },
        "faults": {
            "total": count("fault"),
            "survived": count("fault", "survived"),
            "partly": count("fault", "partly"),
            "not": count("fault", "not"),
            "models_lost": count("fault", model_lost=True),
            "wrong_finished_rows": count("fault", wrong_finished_row=True),
            "probe_errors": count("fault", "probe_error"),
        },
        "security": {
            "total": count("security"),
            "vulnerable": count("security", "vulnerable"),
            # kinds of attack (an item up to its colon: Make variables, row values as paths, _target_ ...)
            # with at least one vulnerable probe
            "items_vulnerable": len(
                {r.item.split(":")[0] for r in results if r.category == "security" and r.outcome == "vulnerable"}
            ),
            "safe": count("security", "safe"),
            "probe_errors": count("security", "probe_error"),
        },
    }


def summary_lines(f: dict) -> list[str]:
    b, fa, s = f["bad_inputs"], f["faults"], f["security"]
    return [
        f"bad inputs ({b['total']}): {b['refused_clearly']} refused clearly ({b['refused_clearly_after_load']} of them "
        f"only after the model loaded), {b['refused_unclearly']} unclearly, {b['accepted_silently']} accepted silently"
        f" ({b['accepted_with_warning']} more with a warning), {b['crashed_with_traceback']} crashed with a traceback "
        f"({b['crashed_leaving_no_row']} leaving no row); {b['probe_errors']} probe errors",
        f"faults ({fa['total']}): {fa['survived']} survived, {fa['partly']} partly, {fa['not']} not; "
        f'{fa["models_lost"]} models lost; {fa["wrong_finished_rows"]} wrong "finished" rows; '
        f"{fa['probe_errors']} probe errors",
        f"security ({s['total']}): {s['vulnerable']} vulnerable ({s['items_vulnerable']} kinds of attack), {s['safe']} "
        f"safe; {s['probe_errors']} probe errors",
    ]


def remove_tree(root: Path) -> None:
    """Remove the battery's folders, read-only ones included (a probe's tmpfs mount is unmounted)."""

    def writable(function, path, _exc):
        os.chmod(os.path.dirname(path), 0o755)
        if os.path.exists(path) and not os.path.islink(path):
            os.chmod(path, 0o755)
        function(path)

    for path in root.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(root, onexc=writable) if sys.version_info >= (3, 12) else shutil.rmtree(root, onerror=writable)


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", action="append", default=[], help="probes whose name or category holds this (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="list the probes and exit")
    parser.add_argument("--out", default=str(ROOT / "results" / "battery.json"), help="the JSON report")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders (their path is printed)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="probes at once (each runs one process at a time)")
    args = parser.parse_args(argv)
    chosen = [p for p in PROBES if not args.only or any(s in p.name or s == p.category for s in args.only)]
    if args.list:
        for p in chosen:
            print(f"{p.name:44s} {p.category:9s} {p.item}")
        print(f"{len(chosen)} probes")
        return 0
    if not chosen:
        print("no probe matches", args.only)
        return 2
    root = Path(tempfile.mkdtemp(prefix="replaceme-battery-"))
    root.chmod(0o755)
    print(f"{len(chosen)} probes, {args.workers} at a time, under {root}", flush=True)
    battery = Battery(root)
    lock = threading.Lock()
    started = time.monotonic()

    def one(p: Probe) -> Result:
        result = run_probe(battery, p)
        with lock:
            flags = [f for f in ("after_load", "no_row", "wrong_finished_row", "model_lost") if getattr(result, f)]
            extra = f" [{', '.join(flags)}]" if flags else ""
            head = f"{result.name:44s} {result.category:9s} {result.outcome:21s}{extra}"
            print(f"{head} {result.detail} ({result.seconds:.0f} s)", flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, min(args.workers, WORKERS))) as pool:
        results = list(pool.map(one, chosen))
    f = figures(results)
    print()
    for line in summary_lines(f):
        print(line)
    print(f"{time.monotonic() - started:.0f} s (load average {os.getloadavg()[2]:.1f} over the last 15 min)")
    report = {
        "git_sha": git_sha(),
        "load_average": os.getloadavg(),  # the seconds depend on what else the machine ran
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": round(time.monotonic() - started),
        "figures": f,
        "probes": [asdict(r) for r in results],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")
    if args.keep:
        print(f"kept {root}")
    else:
        remove_tree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
