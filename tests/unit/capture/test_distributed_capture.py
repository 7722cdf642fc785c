"""One job over several processes (issue 38): the ranks read from the environment, the statistics of a
capture split over 2 gloo processes merged into the one-process statistics, bad combinations refused
before the model loads, and ``torchrun --nproc-per-node 2 run.py`` against the same job in one
process (the same T, the same selection distances; a rank that dies fails the job with a row)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from helpers import ranks
from helpers.config import compose_config

from replaceme_exp.capture.distributed import Ranks, ranks_from_env, shard_bounds
from replaceme_exp.capture.merge import merge
from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime.ranks import follower_overrides
from replaceme_exp.runtime.signals import JobInterrupted, stop_signals_deferred


def test_torchrun_environment_gives_the_ranks():
    env = {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "node7", "MASTER_PORT": "1234"}
    assert ranks_from_env(env) == Ranks(2, 4, 0, "node7", 1234, "torchrun")
    assert ranks_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert ranks_from_env({}) is None


def test_srun_environment_gives_the_ranks_and_rank_0_s_address():
    slurm = {"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[03-04]"}
    asked = []

    def first_host(nodelist):  # stands in for `scontrol show hostnames`
        asked.append(nodelist)
        return "gpu03"

    assert ranks_from_env(slurm, first_host) == Ranks(5, 8, 1, "gpu03", 29500, "srun")
    assert asked == ["gpu[03-04]"]
    launch_node = {**slurm, "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.3"}
    assert ranks_from_env(launch_node, first_host).master_addr == "10.0.0.3"
    given = {**launch_node, "MASTER_ADDR": "head", "MASTER_PORT": "4000"}
    assert ranks_from_env(given, first_host).master_addr == "head"
    assert ranks_from_env(given, first_host).master_port == 4000
    assert ranks_from_env({**launch_node, "SLURM_JOB_ID": "123456"}, first_host).master_port == 23456  # a port per job
    assert ranks_from_env({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None  # a sweep's job: one task
    assert asked == ["gpu[03-04]"]


def test_only_ranks_other_than_0_log_to_a_file_of_their_own():
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    assert follower_overrides([], env) == ["hydra.job.name=run_rank1", "hydra.output_subdir=null"]
    assert follower_overrides([], {**env, "RANK": "0"}) == []
    assert follower_overrides([], {}) == []


def test_rank_blocks_cover_the_batches_in_order():
    for n in (2, 3, 7, 8):
        for world in (2, 3):
            if world > n:
                continue
            blocks = [shard_bounds(n, r, world) for r in range(world)]
            assert [i for lo, hi in blocks for i in range(lo, hi)] == list(range(n))
            sizes = [hi - lo for lo, hi in blocks]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["calibration.n_samples=8", "calibration.batch_size=8"], "calibration.n_samples"),
        (["capture.mode=layerwise"], "capture.mode"),
        (["model.device_map=auto"], "model.device_map"),
        (["selection=sleb", "objective=identity"], "selection.metric"),
        (["experiment=llm_streamline"], "objective"),
        (["job=evaluate"], "job"),
    ],
)
def test_several_ranks_refuse_what_they_cannot_split(monkeypatch, overrides, key):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError) as err:
        JobSpec.from_config(compose_config(["debug=smoke", *overrides]))
    assert err.value.key == key and "2 ranks" in str(err.value)
    monkeypatch.delenv("WORLD_SIZE")
    JobSpec.from_config(compose_config(["debug=smoke", *overrides[:1]]))  # one process: fine


def assert_close(found, expected, path="") -> None:
    if isinstance(expected, dict):
        assert set(found) == set(expected), path
        for key in expected:
            assert_close(found[key], expected[key], f"{path}/{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(found) == len(expected), path
        for i, (a, b) in enumerate(zip(found, expected)):
            assert_close(a, b, f"{path}[{i}]")
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(found, expected, rtol=1e-12, atol=1e-12, msg=path)
    elif isinstance(expected, int):
        assert found == expected, path
    elif expected is None:
        assert found is None, path
    else:
        assert found == pytest.approx(expected, rel=1e-12, abs=1e-14), path


@pytest.mark.slow  # two spawned processes import torch: about 5 s
def test_statistics_merged_over_two_processes_equal_the_one_process_statistics(tmp_path):
    """Each statistic's merge (sums, counts, (sum, count) means, folds by global sequence index, the
    token store in batch order on rank 0) against the same statistic over every batch in one process."""
    torch.multiprocessing.spawn(ranks.capture_on_rank, args=(2, ranks.free_port(), str(tmp_path)), nprocs=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: float32 products may round otherwise on more threads
    try:
        expected = ranks.statistics_of(ranks.batches())
    finally:
        torch.set_num_threads(threads)
    leader, follower = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    for name, rows in expected["store"].items():  # rank 0 holds every rank's tokens in batch order
        assert torch.equal(leader["store"][name], rows), name
    assert not torch.equal(follower["store"]["M"], expected["store"]["M"])  # the others keep their own
    del expected["store"]
    assert expected["cut"][(1, 3)] > 0 and expected["folds"][(1, 3)][2][3] > 0
    assert expected["declared"][1] == ranks.batches().n_tokens  # a declared accumulator: the default merge
    for found in (leader, follower):  # every rank ends with the statistics of all batches
        assert_close({k: v for k, v in found.items() if k != "store"}, expected)


@pytest.mark.slow
def test_a_rank_that_dies_fails_the_merge_in_one_line(tmp_path):
    torch.multiprocessing.spawn(ranks.dies_before_merging, args=(2, ranks.free_port(), str(tmp_path)), nprocs=2)
    error = (tmp_path / "error.txt").read_text()
    assert "\n" not in error and "capture.timeout_s=30" in error and "another rank died" in error


def test_a_stop_signal_while_the_row_is_written_waits_for_it():
    """torchrun stops rank 0 with SIGTERM when another rank dies, often while rank 0 writes its failed row."""
    written = []
    with pytest.raises(JobInterrupted, match="SIGTERM"):
        with stop_signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            written.append("row")
    assert written == ["row"]
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with stop_signals_deferred():  # no signal: nothing raised, the handlers as before
            pass
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_statistic_without_a_merge_is_refused():
    with pytest.raises(TypeError, match="no merge across ranks"):
        merge(object())
