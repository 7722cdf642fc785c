"""Fixtures, and the rule that every test lives in its tier's folder (unit, integration or e2e; pyproject.toml).
What tests share lives in ``tests/helpers/`` (one module per concept)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
from helpers.config import CACHE  # noqa: E402

TIERS = ("unit", "integration", "e2e")


def pytest_configure(config):
    # pytest-xdist workers share the cores: one torch thread each instead of all cores per worker
    # (also for the run.py processes the tests start).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


TIER_PROBLEM = pytest.StashKey[str]()
TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)  # before -m deselects: a test outside a tier folder fails any selection
def pytest_collection_modifyitems(config, items):
    """A test's tier is its folder (``tests/unit``, ``tests/integration``, ``tests/e2e``), given to it as
    a marker so that ``-m unit`` selects it; a tier marker written on a test is refused (it could only
    disagree with the folder)."""
    wrong = []
    for item in items:
        parts = os.path.relpath(str(item.path), TESTS).split(os.sep)
        written = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if parts[0] not in TIERS or written:
            item.stash[TIER_PROBLEM] = (
                f"{item.nodeid}: " + (f"marked {', '.join(written)}" if written else "outside the tier folders")
                + f"; a test's tier is its folder, one of tests/{{{','.join(TIERS)}}}/<package area>/ (pyproject.toml)"
            )
            wrong.append(item.stash[TIER_PROBLEM])
        else:
            item.add_marker(parts[0])
    if wrong and not hasattr(config, "workerinput"):  # a pytest-xdist worker cannot stop the run: see below
        raise pytest.UsageError(f"{len(wrong)} tests outside exactly one tier:\n" + "\n".join(wrong))
    # The slow tests first (in their order): pytest-xdist hands tests out in this order, so the longest
    # ones start early instead of one of them running alone at the end of the run.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Ctrl-C stops the test run: a job under test turns SIGINT into :class:`JobInterrupted` (its
    failed row), which would otherwise be one failed test and the run going on."""
    try:
        return (yield)
    except Exception as err:
        signals = sys.modules.get("replaceme_exp.runtime.signals")  # not imported: no job could raise it
        if signals is not None and isinstance(err, signals.JobInterrupted) and "SIGINT" in str(err):
            raise KeyboardInterrupt(str(err)) from err
        raise


def pytest_runtest_setup(item):
    if TIER_PROBLEM in item.stash:  # under pytest-xdist: the test fails, named, instead of the whole run stopping
        pytest.fail(item.stash[TIER_PROBLEM], pytrace=False)


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from replaceme_exp.models.embedded import embedded_checkpoint

    return AutoTokenizer.from_pretrained(embedded_checkpoint(CACHE))


@pytest.fixture(scope="session")
def slurm_cluster():
    """The one-node SLURM cluster (tests/helpers/slurm.py): started when it is not running, stopped when
    the last test session using it ends if a test session started it. The environment for its clients
    (SLURM_CONF). It skips when the cluster cannot start, and fails instead under
    REPLACEME_REQUIRE_SLURM=1 (CI)."""
    from helpers import slurm

    with slurm.cluster_turn():
        problem = slurm.join_cluster()
    if problem:
        reason = f"the one-node SLURM cluster did not start: {problem}"
        if os.environ.get("REPLACEME_REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    yield dict(os.environ, **slurm.SLURM_ENV)
    with slurm.cluster_turn():
        slurm.leave_cluster()
