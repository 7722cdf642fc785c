"""Progress of long loops: a bar on a terminal, log lines a person can follow in a file, and lm-eval
quiet about the project's own tasks."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest
import torch

from replaceme_exp import progress as progress_module
from replaceme_exp.config import schema
from replaceme_exp.config.validate import build
from replaceme_exp.estimation.numerical import NumericalEstimator
from replaceme_exp.progress import configure, configure_from, progress, progress_counter, resolved_mode


LOGGER = "replaceme_exp.progress"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def restore_settings():
    saved = progress_module.settings()
    yield
    progress_module._settings.update(saved)


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_loop_logs_a_line_every_ten_percent_and_a_final_one(caplog):
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in progress(range(40), desc="capture", unit="batch", mode="log", every_seconds=1e9, clock=clock):
            clock.now += 0.5
    got = lines(caplog)
    # 10%, 20%, ..., 90% (4, 8, ..., 36 of 40), then the final line instead of 100%.
    assert len(got) == 10
    assert got[0] == "capture: 4/40 batches (10%), 2.0 s elapsed, ~18.0 s left"
    assert [int(re.search(r"\((\d+)%\)", line).group(1)) for line in got[:-1]] == list(range(10, 100, 10))
    assert got[-1] == "capture: 40/40 batches done in 20.0 s"


def test_slow_steps_log_every_n_seconds_and_an_unknown_total_logs_counts(caplog):
    clock = FakeClock()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in progress(range(1000), desc="slow", mode="log", every_percent=50, every_seconds=30, clock=clock):
            clock.now += 1.0  # 1000 s in all: a line every 30 s, and the 50% one
        with progress_counter(None, "solver", unit="iteration", mode="log", every_seconds=10, clock=clock) as p:
            for _ in range(25):
                clock.now += 1.0
                p.update()
    got = lines(caplog)
    slow = [line for line in got if line.startswith("slow:")]
    assert 33 <= len(slow) <= 35 and "slow: 500/1000 batches (50%)" in "\n".join(slow)
    assert slow[-1] == "slow: 1000/1000 batches done in 16 min 40 s"
    solver = [line for line in got if line.startswith("solver:")]
    assert solver == [
        "solver: 10 iterations, 10.0 s elapsed",
        "solver: 20 iterations, 20.0 s elapsed",
        "solver: 25 iterations done in 25.0 s",
    ]


def test_off_logs_nothing_and_an_interrupted_loop_logs_no_final_line(caplog, restore_settings):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert list(progress(range(50), desc="quiet", mode="off")) == list(range(50))
        configure(mode="off")
        list(progress(range(50), desc="quiet"))
        with pytest.raises(RuntimeError):
            with progress_counter(10, "broken", mode="log", clock=FakeClock()) as p:
                p.update(3)
                raise RuntimeError("boom")
    assert not any("quiet" in line for line in lines(caplog))
    assert not any("done" in line for line in lines(caplog))


def test_listeners_hear_the_same_points_as_the_log_and_a_failing_one_is_dropped(caplog):
    heard = []

    def broken(desc, done, total):
        raise RuntimeError("tracker down")

    listener = lambda desc, done, total: heard.append((desc, done, total))  # noqa: E731
    progress_module.add_listener(listener)
    progress_module.add_listener(broken)
    try:
        with caplog.at_level(logging.INFO, logger=LOGGER):
            list(progress(range(20), desc="capture", mode="log", every_percent=25, every_seconds=1e9))
            list(progress(range(4), desc="quiet", mode="off"))
    finally:
        progress_module.remove_listener(listener)
        progress_module.remove_listener(broken)
    assert heard == [("capture", 5, 20), ("capture", 10, 20), ("capture", 15, 20), ("capture", 20, 20)]
    assert sum("tracker down" in line for line in lines(caplog)) == 1  # dropped after its first failure


def test_auto_is_a_bar_on_a_terminal_and_log_lines_otherwise(monkeypatch, restore_settings):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    configure_from(build(schema.ProgressConfig, {"mode": "auto", "every_percent": 5, "every_seconds": 12}))
    assert progress_module.settings() == {"mode": "auto", "every_percent": 5.0, "every_seconds": 12.0}
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert resolved_mode() == "log"
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert resolved_mode() == "bar" and resolved_mode("log") == "log"
    with pytest.raises(ValueError, match="choose one of"):
        configure(mode="loud")
    with pytest.raises(ValueError):
        configure(every_percent=0)


def test_the_progress_block_is_validated_and_left_out_of_the_config_hash():
    from helpers.config import compose_config, config_hash, validate_config

    from replaceme_exp.errors import ConfigError

    cfg = compose_config(["model=tiny_llama"])
    assert cfg.progress.mode == "auto" and cfg.progress.every_percent == 10 and cfg.progress.every_seconds == 30
    validate_config(cfg)
    changed = compose_config(["model=tiny_llama", "progress.mode=log", "progress.every_seconds=5"])
    assert config_hash(changed) == config_hash(cfg)
    for override, key in [("progress.mode=loud", "progress.mode"), ("progress.every_percent=0", "every_percent")]:
        with pytest.raises(ConfigError, match=key):
            validate_config(compose_config(["model=tiny_llama", override]))


class FakeStore:
    """Random M, R rows behind the token store's interface."""

    def __init__(self, n_tokens=300, hidden=8):
        g = torch.Generator().manual_seed(0)
        self.compute_device, self.hidden, self.n_tokens = torch.device("cpu"), hidden, n_tokens
        m = torch.randn(n_tokens, hidden, generator=g)
        self.tensors = {"M": m, "R": m @ torch.randn(hidden, hidden, generator=g) * 0.5 + m}

    def rows(self, indices):
        return {k: v.index_select(0, indices) for k, v in self.tensors.items()}


@pytest.mark.parametrize(
    "solver, kwargs, pattern",
    [
        ("adam", dict(epochs=3, batch_tokens=100), r"cosine/adam \(3 epochs\): 9/9 steps done"),
        ("lbfgs", dict(max_iter=20), r"cosine/lbfgs \(full batch, at most 20 iterations\): \d+/20 iterations done"),
        ("nlcg", dict(max_iter=15), r"cosine/nlcg \(full batch, at most 15 iterations\): \d+/15 iterations done"),
        ("lbfgs", dict(schedule="minibatch", epochs=2, batch_tokens=100), r"\(minibatch, 2 epochs\): 6/6 batches"),
    ],
    ids=["adam", "lbfgs", "nlcg", "lbfgs-minibatch"],
)
def test_solvers_report_their_iterations(caplog, restore_settings, solver, kwargs, pattern):
    configure(mode="log")
    estimator = NumericalEstimator("cosine", "cosine", solver=solver, lr=1e-2, **kwargs)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        _, info = estimator.fit(FakeStore(), 0.0, "none", "generic", seed=0)
    final = [line for line in lines(caplog) if " done in " in line]
    assert len(final) == 1 and re.search(pattern, final[0]), lines(caplog)
    if kwargs.get("schedule") != "minibatch" and solver != "adam":
        assert final[0].split(": ")[1].startswith(f"{info['steps']}/")  # the iterations the solver ran
