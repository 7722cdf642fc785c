"""The one-node SLURM cluster of ``scripts/slurm-cluster.sh`` for the e2e tests, and sweeps through it.

A test holds :func:`cluster_turn` while it uses the cluster, so that tests on other pytest-xdist workers
do not take its CPUs (its assertions count which jobs ran side by side). ``REPLACEME_REQUIRE_SLURM=1``
(CI sets it) makes a cluster that cannot start a failure instead of a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.config import CACHE, ROOT
from replaceme_exp.storage import pid_alive

SCRIPT = ROOT / "scripts" / "slurm-cluster.sh"
CLUSTER_DIR = Path(os.environ.get("REPLACEME_SLURM_DIR", "/tmp/replaceme-slurm"))
SLURM_ENV = {"SLURM_CONF": str(CLUSTER_DIR / "slurm.conf")}

# The sitecustomize of every Python process of a sweep started with waiting_env (PYTHONPATH): the job of
# array task REPLACEME_TEST_WAIT_TASK (0 in a sweep of one job), in its first attempt (not after a
# requeue), waits in its first perplexity pass for a stop signal, after writing the file waiting-<task>
# (its SLURM job, as the row's slurm_job names it); so a signal always lands mid-job.
WAIT_HOOK = """
import importlib.abc, importlib.util, os, sys, time
from pathlib import Path


def _wait(*args, **kwargs):
    marker = Path(os.environ["REPLACEME_TEST_WAIT_DIR"]) / ("waiting-" + os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    array = os.environ.get("SLURM_ARRAY_JOB_ID")  # the job as the row's slurm_job names it
    marker.write_text(f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"])
    print("waiting for the signal", flush=True)
    time.sleep(600)


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "replaceme_exp.pipeline.text":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            module.window_perplexity = _wait

        spec.loader.exec_module = exec_module
        return spec


first_attempt = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
task = os.environ.get("SLURM_ARRAY_TASK_ID", "0")  # a sweep of one job is no array
if "SLURM_JOB_ID" in os.environ and task == os.environ.get("REPLACEME_TEST_WAIT_TASK") and first_attempt:
    sys.meta_path.insert(0, _Patch())
"""


def cluster_up() -> bool:
    """Whether the cluster's node answers, idle or busy."""
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], env=dict(os.environ, **SLURM_ENV), capture_output=True,
                              text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and any(s.startswith(("idle", "mixed", "alloc")) for s in proc.stdout.split())


def start_cluster() -> str | None:
    """Starts the cluster (installing slurm-wlm and munge when missing, as root or with sudo); None, or why
    it did not start."""
    proc = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    return None if proc.returncode == 0 else proc.stderr.strip()[-3000:] or f"exit {proc.returncode}"


USERS = CLUSTER_DIR.with_name(CLUSTER_DIR.name + "-tests")  # who uses the cluster, and whether tests started it


def join_cluster() -> str | None:
    """Registers this process as a user of the cluster, starting it when it is down (then the last user
    stops it); None, or why it did not start. Under :func:`cluster_turn`."""
    USERS.mkdir(exist_ok=True)
    if not cluster_up():
        if problem := start_cluster():
            return problem
        (USERS / "started").touch()
    (USERS / f"user-{os.getpid()}").touch()
    return None


def leave_cluster() -> None:
    """Unregisters this process; the last user (dead ones do not count) stops a cluster the tests started.
    Under :func:`cluster_turn`."""
    (USERS / f"user-{os.getpid()}").unlink(missing_ok=True)
    alive = [f for f in USERS.glob("user-*") if pid_alive(int(f.name.removeprefix("user-")))]
    if not alive and (USERS / "started").exists():
        subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=120)
        (USERS / "started").unlink()


@contextlib.contextmanager
def cluster_turn():
    """The cluster for one test at a time (a lock file beside the cluster's folder)."""
    USERS.mkdir(exist_ok=True)
    with open(USERS / "turn.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def sweep_command(results_dir: Path, *overrides: str) -> list[str]:
    """``run.py -m`` of the tiny job through ``hydra/launcher=slurm_cpu``, rows and statistics under
    ``results_dir``, the converted models from the tests' cache, no model saved unless ``overrides`` say."""
    saves = [] if any(o.startswith("save_model=") for o in overrides) else ["save_model=false"]
    return [
        sys.executable, "run.py", "-m", "hydra/launcher=slurm_cpu", "debug=smoke", *saves,
        f"results_dir={results_dir}", f"cache_dir={CACHE}", f"capture.cache_dir={results_dir}/stats",
        "hydra.launcher.mem_gb=2", *overrides,
    ]  # fmt: skip


def start_sweep(results_dir: Path, env: dict, *overrides: str, log_name: str = "sweep.log") -> subprocess.Popen:
    """Launches the sweep in the background, its console in ``results_dir/<log_name>``."""
    results_dir.mkdir(parents=True, exist_ok=True)
    log = open(results_dir / log_name, "w")  # noqa: SIM115 - the process writes it until it ends
    env = dict(env, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen(sweep_command(results_dir, *overrides), cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


def waiting_env(env: dict, hooks_dir: Path, task: int) -> dict:
    """``env`` with :data:`WAIT_HOOK` as the sitecustomize of every Python process: array task ``task``
    waits in its first attempt (see the hook) and says so by a file ``hooks_dir/waiting-<task>``."""
    hooks_dir.mkdir(parents=True, exist_ok=True)
    (hooks_dir / "sitecustomize.py").write_text(WAIT_HOOK)
    path = os.pathsep.join(filter(None, [str(hooks_dir), env.get("PYTHONPATH")]))
    return dict(env, PYTHONPATH=path, REPLACEME_TEST_WAIT_DIR=str(hooks_dir), REPLACEME_TEST_WAIT_TASK=str(task))


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> str:
    """The text of ``path`` once it exists (the sweep must still run)."""
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the sweep ended (exit {proc.returncode}) before {path.name} appeared"
        assert time.time() < deadline, f"{path.name} did not appear in {timeout:.0f} s"
        time.sleep(0.5)
    time.sleep(0.2)
    return path.read_text()


def slurm(env: dict, *args: str) -> str:
    """A SLURM client command's output (scancel, sbatch, squeue, scontrol)."""
    return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=60, check=True).stdout
