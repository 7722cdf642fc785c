"""One job over several processes (issue 38): the ranks read from the environment, the statistics of a
capture split over 2 gloo processes merged into the one-process statistics, bad combinations refused
before the model loads, and ``torchrun --nproc-per-node 2 run.py`` against the same job in one
process (the same T, the same selection distances; a rank that dies fails the job with a row)."""

from __future__ import annotations

import glob
import os
import signal

import pytest
import torch
from helpers import ranks
from helpers.config import compose_config
from helpers.same_job import assert_same_job, rows_of, run_job, transforms_of

from replaceme_exp.capture import distributed
from replaceme_exp.capture.distributed import Ranks, ranks_from_env, shard_bounds
from replaceme_exp.capture.merge import merge
from replaceme_exp.errors import ConfigError
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime.ranks import follower_overrides
from replaceme_exp.runtime.signals import JobInterrupted, stop_signals_deferred

# ---- the ranks from the environment ----------------------------------------------------------


@pytest.mark.unit
def test_torchrun_environment_gives_the_ranks():
    env = {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "node7", "MASTER_PORT": "1234"}
    assert ranks_from_env(env) == Ranks(2, 4, 0, "node7", 1234, "torchrun")
    assert ranks_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert ranks_from_env({}) is None


@pytest.mark.unit
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


@pytest.mark.unit
def test_only_ranks_other_than_0_log_to_a_file_of_their_own():
    env = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    assert follower_overrides([], env) == ["hydra.job.name=run_rank1", "hydra.output_subdir=null"]
    assert follower_overrides([], {**env, "RANK": "0"}) == []
    assert follower_overrides([], {}) == []


@pytest.mark.unit
def test_rank_blocks_cover_the_batches_in_order():
    for n in (2, 3, 7, 8):
        for world in (2, 3):
            if world > n:
                continue
            blocks = [shard_bounds(n, r, world) for r in range(world)]
            assert [i for lo, hi in blocks for i in range(lo, hi)] == list(range(n))
            sizes = [hi - lo for lo, hi in blocks]
            assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


# ---- bad combinations: one ConfigError before the model loads -----------------------------------


@pytest.mark.unit
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


# ---- each statistic merged across 2 gloo processes ------------------------------------------------


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


@pytest.mark.unit
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


@pytest.mark.unit
@pytest.mark.slow
def test_a_rank_that_dies_fails_the_merge_in_one_line(tmp_path):
    torch.multiprocessing.spawn(ranks.dies_before_merging, args=(2, ranks.free_port(), str(tmp_path)), nprocs=2)
    error = (tmp_path / "error.txt").read_text()
    assert "\n" not in error and "capture.timeout_s=30" in error and "another rank died" in error


@pytest.mark.unit
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


@pytest.mark.unit
def test_a_statistic_without_a_merge_is_refused():
    with pytest.raises(TypeError, match="no merge across ranks"):
        merge(object())


# ---- run.py under torchrun against one process ---------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_torchrun_two_ranks_find_the_one_process_ls_transform(tmp_path):
    one, two = run_job(tmp_path / "one", 1), run_job(tmp_path / "two", 2)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    assert_same_job(tmp_path / "one", tmp_path / "two")
    log = two.stdout + two.stderr
    assert "[rank 1/2]" in log and "capture (selection) [rank 1/2]" in log
    assert not glob.glob(f"{tmp_path}/two/hydra/runs/*/.hydra/*rank*")
    assert glob.glob(f"{tmp_path}/two/hydra/runs/*/run_rank1.log")


@pytest.mark.e2e
@pytest.mark.slow
def test_torchrun_two_ranks_gather_the_token_store_of_a_numerical_objective(tmp_path):
    numerical = ["objective=cosine", "objective.epochs=2", "objective.lr=1e-3", "cuts=[[2,4]]"]
    one, two = run_job(tmp_path / "one", 1, *numerical), run_job(tmp_path / "two", 2, *numerical)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    (row1,), (row2,) = rows_of(tmp_path / "one"), rows_of(tmp_path / "two")
    assert row1["fit_tokens"] == row2["fit_tokens"] and row1["loss_curves"] == row2["loss_curves"]
    (t1,), (t2,) = transforms_of(tmp_path / "one").values(), transforms_of(tmp_path / "two").values()
    assert not torch.equal(t1, torch.eye(t1.shape[0], dtype=t1.dtype))  # Adam moved T
    assert float((t2 - t1).abs().max() / t1.abs().max()) < 1e-10


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rank_that_dies_mid_capture_fails_the_job_with_a_row(tmp_path):
    fault = {distributed.FAULT_ENV: "1"}
    proc = run_job(tmp_path, 2, "capture.timeout_s=20", env_extra=fault, timeout=200)
    assert proc.returncode != 0
    (row,) = rows_of(tmp_path)
    assert row["status"] == "failed" and row["world_size"] == 2
    assert row["failed_stage"].startswith("capture") and "\n" not in row["error"]
    assert "SIGTERM" in row["error"] or "another rank died" in row["error"]
    assert not glob.glob(f"{tmp_path}/transforms/*")
