"""Issue 23, the configuration: what was accepted silently is refused in one line, what needs only the
model's config is checked before its weights load, and a user's mistake gives no traceback."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import yaml
from helpers.config import CONF, ROOT, compose_config
from helpers.integrity_config import no_model_loads, refused
from helpers.jobs import job_config

from replaceme_exp.config import schema
from replaceme_exp.errors import ConfigError
from replaceme_exp.estimation.estimators import ALLOWED_TARGET_PREFIXES
from replaceme_exp.models.shape import model_shape
from replaceme_exp.pipeline.rules import check_job, check_shape
from replaceme_exp.pipeline.spec import JobSpec
from replaceme_exp.runtime.composition import raised_while_composing
from replaceme_exp.runtime.log_files import FILE_ONLY, console_skips_file_only


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["model.device_map=bogus"], "model.device_map='bogus': choose auto, balanced"),
        (["structure=orthonormal", "alpha=10"], "alpha=10: has no effect with structure=orthonormal"),
        (["seed=99999999999999999999999"], "seed=99999999999999999999999: is beyond the 64-bit integer range"),
        (["seed=${oc.env:REPLACEME_SURELY_UNSET}"], "seed='${oc.env:REPLACEME_SURELY_UNSET}': cannot be resolved"),
        (["alpha=${alpha}"], "alpha='${alpha}': cannot be resolved: Recursive interpolation"),
        (["objective._target_=os.system"], "objective._target_='os.system': only the project's estimator classes and its plugins' (replaceme_exp.*)"),
        (["objective._target_=subprocess.Popen"], "objective._target_='subprocess.Popen': only the project's"),
        (["model.device=cuda:0"], "model.device='cuda:0': this machine has no CUDA GPU"),
        (["capture.cache_dir=/dev/null/stats"], "capture.cache_dir='/dev/null/stats': /dev/null is a file"),
    ],
)
def test_what_was_accepted_silently_is_refused_in_one_line(tmp_path, no_model_loads, overrides, named):
    assert refused(tmp_path, *overrides).startswith(named)


def test_the_step_store_s_folder_is_checked_for_a_stepwise_search_even_without_the_statistics_cache(
    tmp_path, no_model_loads
):
    off = ["capture.cache=false", "capture.cache_dir=/dev/null/stats"]
    assert refused(tmp_path, "experiment=sleb", *off).startswith("capture.cache_dir='/dev/null/stats': /dev/null")
    # a search that keeps no steps, or a store switched off, leaves the folder alone
    for other in (["experiment=shortgpt"], ["experiment=sleb", "capture.search_steps=false"]):
        JobSpec.from_config(job_config(tmp_path, *other, *off))


def test_hydra_instantiates_only_the_projects_and_its_own_classes():
    from omegaconf import OmegaConf

    from replaceme_exp.runtime.targets import foreign_targets

    config = OmegaConf.create(
        {
            "hydra": {
                "callbacks": {
                    "ours": {"_target_": "replaceme_exp.runtime.callbacks.DirectoryCheck"},
                    "shared": {"_target_": "shutil.copyfile", "src": "a", "dst": "b"},
                },
                "launcher": {"_target_": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"},
                "sweeper": {"_target_": "os.system"},
            }
        }
    )
    assert foreign_targets(config) == [
        ("hydra.callbacks.shared._target_", "shutil.copyfile"),
        ("hydra.sweeper._target_", "os.system"),
    ]


@pytest.mark.parametrize("value", ["auto", "sequential", "balanced_low_0", "cpu", "cuda:1"])
def test_device_maps_accelerate_takes_are_accepted(value):
    JobSpec.from_config(compose_config(["debug=smoke", f"model.device_map={value}"]))


def test_alpha_stays_for_structures_it_acts_on():
    JobSpec.from_config(compose_config(["debug=smoke", "structure=diagonal", "alpha=10"]))
    JobSpec.from_config(compose_config(["debug=smoke", "structure=orthonormal", "alpha=0"]))


@pytest.mark.parametrize(
    "given, named",
    [
        (["cuts=[[1,3]]", "n_prune=4"], "n_prune=4: not with explicit cuts=[[1, 3]], which prune 2 blocks"),
        (["cuts=[[1,3]]", "num_lts=2"], "num_lts=2: not with explicit cuts=[[1, 3]], which are 1"),
        (["cuts=[[1,2],[3,5]]", "+n_prune=2"], "n_prune=2: not with explicit cuts=[[1, 2], [3, 5]], which prune 3"),
    ],
)
def test_n_prune_or_num_lts_given_beside_cuts_must_agree(tmp_path, no_model_loads, given, named):
    overrides = [o.lstrip("+") for o in given]
    assert refused(tmp_path, *overrides, given=given).startswith(named)


def test_n_prune_and_num_lts_that_agree_with_the_cuts_pass(tmp_path):
    from replaceme_exp.pipeline.rules import check_given_together

    c = JobSpec.from_config(job_config(tmp_path, "cuts=[[1,2],[3,5]]", "n_prune=3", "num_lts=2")).config
    check_given_together(c, {"cuts", "n_prune", "num_lts"})
    c = JobSpec.from_config(job_config(tmp_path, "cuts=[[1,3]]", "n_prune=4")).config
    check_given_together(c, {"cuts"})  # the default n_prune, not given: the cuts decide


def test_generation_samples_are_refused_for_a_vision_encoder():
    c = JobSpec.from_config(compose_config(["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline"]))
    samples = schema.SamplesConfig(prompts=["Write one sentence about the sun."])
    config = dataclasses.replace(c.config, eval=dataclasses.replace(c.config.eval, samples=samples))
    with pytest.raises(ConfigError, match=r"^eval.samples=.*not for a vision encoder"):
        check_job(config, c.requirements)


def test_every_shipped_target_is_one_of_the_projects_own():
    targets = []
    for path in [*CONF.rglob("*.yaml"), *(ROOT / "replaceme_exp" / "multirun_templates").rglob("*.yaml")]:
        text = yaml.safe_load(path.read_text()) or {}
        stack = [text]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                targets += [v for k, v in node.items() if k == "_target_"]
                stack += list(node.values())
            elif isinstance(node, list):
                stack += node
    assert targets and all(t.startswith(ALLOWED_TARGET_PREFIXES) for t in targets), targets


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["cuts=[[2,9]]"], "cuts=[[2, 9]]: [2, 9) is outside 1 <= start < end <= num_layers=6"),
        (["cuts=[[1,3],[3,5]]", "merge_consecutive=false"], "cuts=[[1, 3], [3, 5]]: [1, 3) and [3, 5) touch"),
        (["cuts=[[1,4],[3,5]]"], "cuts=[[1, 4], [3, 5]]: [1, 4) and [3, 5) overlap"),
        (["n_prune=6"], "n_prune=6: the model has 6 blocks; at most 5"),
        (["n_prune=3", "num_lts=2"], "num_lts=2: must divide n_prune=3"),
        (["calibration.seq_len=4096"], "calibration.seq_len=4096: is beyond the 2048 positions of model=tiny_llama"),
        (["eval.seq_len=3000"], "eval.seq_len=3000: is beyond the 2048 positions"),
        (["model.config.num_attention_heads=3"], "model.config.num_attention_heads=3: must divide model.config.hidden"),
        (["model.config.num_key_value_heads=3"], "model.config.num_key_value_heads=3: must divide model.config.num_"),
        (["model.config.num_hidden_layers=1"], "model.config.num_hidden_layers=1: pruning needs at least 2 blocks"),
        (["model.config.hidden_size=-4"], "model.config.hidden_size=-4: must be a positive integer"),
        (["+model.config.hidden_act=bogus"], "model.config='llama': describes a model that cannot be built"),
        (["model.config.model_type=bogus"], "model.config='bogus': is not a config transformers can build"),
    ],
)
def test_what_needs_the_models_config_is_refused_before_its_weights_load(tmp_path, no_model_loads, overrides, named):
    assert refused(tmp_path, *overrides).startswith(named)


def test_the_shape_is_read_from_the_config_on_the_meta_device():
    c = JobSpec.from_config(compose_config(["debug=smoke"])).config
    shape = model_shape(c.model)
    assert (shape.num_layers, shape.max_positions) == (6, 2048)
    assert all(p.device.type == "meta" for p in shape.model.parameters())
    check_shape(c, shape)


def test_a_bugs_traceback_reaches_the_log_file_not_the_console(tmp_path):
    root = logging.getLogger()
    file_handler = logging.FileHandler(tmp_path / "run.log")
    console_stream = open(tmp_path / "console.txt", "w")  # noqa: SIM115
    console = logging.StreamHandler(console_stream)
    root.addHandler(file_handler)
    root.addHandler(console)
    try:
        console_skips_file_only()
        logging.getLogger("replaceme_exp.job").error("Traceback (most recent call last): ...", extra=FILE_ONLY)
        logging.getLogger("replaceme_exp.job").error("job failed: one line")
    finally:
        for handler in (file_handler, console):
            root.removeHandler(handler)
            handler.close()
    assert "Traceback" in (tmp_path / "run.log").read_text()
    assert (tmp_path / "console.txt").read_text() == "job failed: one line\n"


def test_only_errors_raised_inside_hydra_or_omegaconf_count_as_composition_errors():
    clip = ["model=tiny_clip", "calibration=bundled_images", "eval=clip_offline"]
    with pytest.raises(Exception) as composing:  # noqa: B017 - OmegaConf fails with a plain AttributeError
        compose_config([*clip, "eval.samples={prompts:[hi]}"])
    assert raised_while_composing(composing.value)
    with pytest.raises(AttributeError) as bug:
        schema.SamplesConfig.nothing  # noqa: B018
    assert not raised_while_composing(bug.value)
