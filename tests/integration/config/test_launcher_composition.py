"""Every eval option composes with every launcher where the launcher re-composes the job.

joblib's loky workers and submitit's SLURM jobs get Hydra's singletons (the ConfigStore with the
schema) pickled by cloudpickle, and compose the job again from them in another process. A config
that composes in the main process must compose there too (issue 50: the default eval did not)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import cloudpickle
from hydra.core.singleton import Singleton
from tests.helpers.config import CONF, ROOT


HYDRA_LAUNCHERS = ["basic", "joblib", "submitit_local", "submitit_slurm"]

WORKER = r"""
import json, sys
import cloudpickle
from hydra import compose, initialize_config_dir
from hydra.core.singleton import Singleton

Singleton.set_state(cloudpickle.loads(open(sys.argv[1], "rb").read()))
failed = {}
with initialize_config_dir(config_dir=sys.argv[2], version_base="1.3"):
    for overrides in json.loads(sys.argv[3]):
        try:
            compose("config", overrides=overrides, return_hydra_config=True)
        except Exception as err:
            failed[" ".join(overrides)] = str(err).splitlines()[0] if str(err) else type(err).__name__
print(json.dumps(failed))
"""


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.slow
def test_every_eval_option_composes_with_every_launcher_in_another_process(tmp_path):
    launchers = _options("hydra/launcher") + HYDRA_LAUNCHERS
    evals = _options("eval")
    assert "local_parallel" in launchers and "slurm_cpu" in launchers and "quick" in evals
    combinations = [[f"hydra/launcher={launcher}", f"eval={option}"] for launcher in launchers for option in evals]
    combinations.append(["hydra/launcher=joblib"])  # the default eval, as a hand-typed sweep has it

    import replaceme_exp.pipeline  # noqa: F401  (the schema in the ConfigStore, as run.py has it)

    state = tmp_path / "singletons.pkl"
    state.write_bytes(cloudpickle.dumps(Singleton.get_state()))
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(state), str(CONF), json.dumps(combinations)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert failed == {}, failed
