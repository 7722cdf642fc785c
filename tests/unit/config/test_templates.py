"""Every multirun template composes and expands to the number of jobs its table, figure or study
declares (replaceme_exp/reporting/artifacts.py), and belongs to exactly one of them."""

from __future__ import annotations

import re

import pytest
from helpers.config import CONF, ROOT, compose_config
from helpers.templates import TEMPLATES, compose_config_with_hydra, expand, template_override

import replaceme_exp.reporting  # noqa: F401  (registers every table, figure and study)
from replaceme_exp.reporting.artifacts import PAPER_ARTIFACTS, template_jobs


# How many jobs each template expands to, as its table's, figure's or study's record declares.
EXPECTED_JOBS = template_jobs()


@pytest.mark.parametrize("template", TEMPLATES)
def test_template_jobs_pass_validation(template):
    from helpers.config import validate_config
    from omegaconf import open_dict

    cfg = compose_config_with_hydra(template)
    with open_dict(cfg):
        del cfg["hydra"]
    validate_config(cfg)


def test_the_clip_template_without_images_is_refused_in_one_line():
    from helpers.config import validate_config
    from hydra import compose, initialize_config_dir

    from replaceme_exp.errors import ConfigError

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["+paper=clip"])
    with pytest.raises(ConfigError, match=r"^calibration.path='\?\?\?': is missing: give it"):
        validate_config(cfg)


def test_every_template_is_counted():
    assert TEMPLATES == sorted(EXPECTED_JOBS)


@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.slow
def test_template_composes_and_expands(template):
    cfg, jobs = expand(template)
    assert len(jobs) == EXPECTED_JOBS[template]
    text = (ROOT / "multirun_templates" / f"{template}.yaml").read_text()
    assert text.startswith("# @package _global_\n# ") and f"python run.py -m {template_override(template)}" in text
    assert "GPU hours" in text or "CPU time" in text
    # Each job's overrides compose too (e.g. cuts and model names are valid).
    for job in jobs[:: max(1, len(jobs) // 6)]:
        overrides = [template_override(template)] + [f"{k}={_value(v)}" for k, v in job.items()]
        composed = compose_config(overrides)
        assert composed.model.name and composed.eval.name


def _value(v) -> str:
    return str(v).replace(" ", "") if isinstance(v, list) else str(v)


@pytest.mark.parametrize(
    ("template", "job", "expected"),
    [
        ("llama3_main", "experiment=multi_lt_nc_cosine", {"objective.name": "cosine", "num_lts": 2}),
        ("llama3_main", "experiment=uidl_baseline", {"objective.name": "identity", "selection.tokens": "last"}),
        ("healing", "healing=lt_only", {"healing.name": "lt_only", "healing.max_steps": 80000}),
        ("layer_distances", "seed=42", {"record_layer_distances": True, "calibration.n_samples": 256}),
        ("task_specific", "calibration=sciq", {"calibration.dataset": "allenai/sciq", "eval.name": "sciq"}),
        ("model_scales", "n_prune=0.25", {"n_prune": 0.25, "objective.name": "ls", "calibration.name": "slimorca"}),
        ("structured_lts_uidl_nc", "experiment=uidl_baseline", {"objective.name": "identity", "num_lts": 1}),
        (
            "structured_lts_uidl_nc",
            "experiment=multi_lt_nc_ls",
            {"objective.name": "ls", "num_lts": 4, "merge_consecutive": False, "structure.name": "generic"},
        ),
        (
            "cosine_approximation_multi_a",
            "objective=cosine_exact",
            {"objective.name": "cosine_exact", "merge_consecutive": False, "n_prune": 8},
        ),
        (
            "cosine_approximation_multi_a",
            "num_lts=4",
            {"num_lts": 4, "merge_consecutive": False, "n_prune": 8},
        ),
    ],
)
def test_template_jobs_get_their_method(template, job, expected):
    from omegaconf import OmegaConf

    cfg = compose_config([f"+paper={template}", job])
    for key, value in expected.items():
        assert OmegaConf.select(cfg, key) == value, key


def test_every_template_belongs_to_exactly_one_table_figure_or_study():
    owners: dict[str, list[str]] = {}
    for name, artifact in PAPER_ARTIFACTS.items():
        assert artifact.kind in ("table", "figure", "study") and artifact.sweeps, name
        for sweep in artifact.sweeps:
            owners.setdefault(sweep.template, []).append(name)
    assert sorted(owners) == TEMPLATES
    shared = {t: names for t, names in owners.items() if len(names) > 1}
    assert shared == {  # one sweep fills the methods tables at both compressions, and their figure
        "methods/equal_compression": [
            "methods_equal_compression",
            "methods_equal_compression_deeper",
            "methods_quality_speed",
        ],
        # its 4-transform cosine job is also the main table's 4-LT Multi_LT_NC (Cosine) row
        "paper/cosine_approximation_multi_a": ["cosine_approximation", "llama3_main"],
    }, owners
    counts = {
        sweep.jobs
        for name in shared["methods/equal_compression"]
        for sweep in PAPER_ARTIFACTS.get(name).sweeps
        if sweep.template == "methods/equal_compression"
    }
    assert counts == {30}  # each names the whole sweep's jobs
    # the 25% table's draws: its own sweep, of that table alone
    assert owners["methods/equal_compression_draws"] == ["methods_equal_compression"]
    assert owners["paper/regularization_cosine"] == ["regularization"]  # two sweeps fill one table


def test_the_main_tables_seeds_vary_only_the_solver_as_the_papers_significance_study():
    jobs = [compose_config(["+paper=llama3_main", "experiment=replaceme_cosine", f"seed={s}"]) for s in (42, 43, 44)]
    assert [j.seed for j in jobs] == [42, 43, 44]
    assert {j.calibration.seed for j in jobs} == {42}  # one calibration sample
    assert {j.eval.harness.fewshot_seed for j in jobs} == {1234}  # lm-eval's few-shot draw, not the job's seed


# The significance study's premise ("the analytical solution always leads to the same results"): with the
# calibration sample and lm-eval's few-shot draw fixed, the job's seed moves only a trained or numerical
# fit (Adam's batch order, LLM-Streamline's training); LS, UIDL and LaCo would repeat one result.
SEEDED_MAIN_METHODS = ("replaceme_cosine", "multi_lt_nc_cosine", "llm_streamline")


DETERMINISTIC_MAIN_METHODS = ("uidl_baseline", "replaceme_ls", "laco")


@pytest.mark.slow
def test_the_main_table_runs_the_deterministic_methods_once_and_the_seeded_ones_at_three_seeds():
    runs: dict[str, list[int]] = {}
    # the table's method sweeps (its 4-LT cosine row comes from +paper=cosine_approximation_multi_a, one seed)
    sweeps = [s for s in PAPER_ARTIFACTS.get("llama3_main").sweeps if s.template.startswith("paper/llama3_main")]
    assert len(sweeps) == 2
    for sweep in sweeps:
        for job in expand(sweep.template)[1]:
            overrides = [template_override(sweep.template)] + [f"{k}={v}" for k, v in job.items()]
            runs.setdefault(job["experiment"], []).append(compose_config(overrides).seed)
    assert {m: runs[m] for m in DETERMINISTIC_MAIN_METHODS} == {m: [42] for m in DETERMINISTIC_MAIN_METHODS}
    assert {m: sorted(runs[m]) for m in SEEDED_MAIN_METHODS} == {m: [42, 43, 44] for m in SEEDED_MAIN_METHODS}
    assert sorted(runs) == sorted(DETERMINISTIC_MAIN_METHODS + SEEDED_MAIN_METHODS)


# The panels of the paper's figure "Comparison between our method and UIDL with different number of
# pruned layers" (replaceme_paper.tex, its \nextgroupplot titles); its caption also names "Mistral 3 7B",
# which has no panel.
PAPER_PRUNED_LAYERS_PANELS = ("llama3_8b_instruct", "falcon2_11b", "qwen25_7b_instruct")


def test_each_pruned_layers_panel_beyond_the_paper_is_named_as_such_in_its_template_and_figure():
    from replaceme_exp.reporting.paper_figures import PRUNED_LAYERS_MODELS

    beyond = []
    for sweep in PAPER_ARTIFACTS.get("pruned_layers").sweeps:
        cfg, jobs = expand(sweep.template)
        text = (ROOT / "multirun_templates" / f"{sweep.template}.yaml").read_text().splitlines()
        header = " ".join(line.lstrip("# ") for line in text if line.startswith("#"))
        for model in sorted({job.get("model", cfg.model.name) for job in jobs} - set(PAPER_PRUNED_LAYERS_PANELS)):
            beyond.append(model)
            assert re.search(rf"{model}[^.]* beyond the paper", header), (sweep.template, model)
    assert beyond == ["mistral_7b_instruct_v03"]
    assert all("beyond the paper" in PRUNED_LAYERS_MODELS[m] for m in beyond)
    assert not any("beyond the paper" in PRUNED_LAYERS_MODELS[m] for m in PAPER_PRUNED_LAYERS_PANELS)


# Tables whose every row a job of their sweeps fills, each job one row: per template, its job count
# and the commands documented in it (the overrides added to each of its jobs; [] is the plain one).
QWEN = ["model=qwen25_7b_instruct", "n_prune=7"]  # cosine_approximation.yaml's Qwen 2.5 7B rows


ROWS_FILLED_BY_SWEEPS = {
    "structured_lts": {"paper/structured_lts": (3, [[]]), "paper/structured_lts_uidl_nc": (2, [[]])},
    "cosine_approximation": {
        "paper/cosine_approximation": (2, [[], QWEN]),
        "paper/cosine_approximation_multi_a": (4, [[]]),
    },
}


def test_the_non_consecutive_structured_row_is_the_multi_lt_ablations_four_lt_job():
    """The structured-LT table's "Generic, non-consecutive" numbers are the multi-LT ablation's 4-LT LS
    row: its job is that one (one config hash, run once), not a 2-LT job."""
    from replaceme_exp.pipeline.spec import JobSpec

    def spec(*overrides):
        return JobSpec.from_config(compose_config(list(overrides)))

    non_consecutive = spec("+paper=structured_lts_uidl_nc", "experiment=multi_lt_nc_ls")
    four_lts = spec("+paper=multi_lt_count", "model=llama3_8b_instruct", "num_lts=4")
    assert non_consecutive.setting_columns()["num_lts"] == 4
    assert non_consecutive.config_hash == four_lts.config_hash


def test_the_cosine_multi_lt_nc_rows_run_two_and_four_transforms_and_say_why():
    """The paper states no count for its cosine Multi_LT_NC and Multi_A rows: both tables show 2 and 4
    transforms, the main table's 4-LT row filled by the Multi_A sweep's cosine job, and say so."""
    import pandas as pd
    from helpers.tables import SPECS

    from replaceme_exp.pipeline.spec import JobSpec
    from replaceme_exp.reporting.paper_settings import select_cell
    from replaceme_exp.reporting.paper_tables import to_markdown

    main = SPECS["llama3_main"]
    assert "paper/cosine_approximation_multi_a" in {sweep.template for sweep in main.sweeps}
    four = next(r for r in main.row_specs() if r.text.get("Linear transform", "").endswith("4 LTs"))
    job = ["+paper=cosine_approximation_multi_a", "objective=cosine", "num_lts=4"]
    written = pd.DataFrame([{"job": "4", **JobSpec.from_config(compose_config(job)).setting_columns()}])
    assert len(select_cell(written, {**main.where, **four.conditions})) == 1
    for name in ("llama3_main", "cosine_approximation"):
        assert "both 2" in to_markdown(SPECS[name], pd.DataFrame({"Setting": []})), name


@pytest.mark.parametrize("table", sorted(ROWS_FILLED_BY_SWEEPS))
@pytest.mark.slow
def test_every_row_of_the_table_is_filled_by_one_job_of_its_sweeps(table):
    """The jobs of the table's sweeps, as the rows they write (JobSpec's setting columns), against
    the conditions of its cells: each row matches one job and each job one row."""
    import pandas as pd
    from helpers.tables import SPECS

    from replaceme_exp.pipeline.spec import JobSpec
    from replaceme_exp.reporting.paper_settings import select_cell

    spec, templates = SPECS[table], ROWS_FILLED_BY_SWEEPS[table]
    assert {sweep.template: sweep.jobs for sweep in spec.sweeps} == {t: n for t, (n, _) in templates.items()}
    written = []
    for template, (n_jobs, commands) in templates.items():
        jobs = expand(template)[1]
        assert len(jobs) == n_jobs
        for extra in commands:
            for job in jobs:
                overrides = [template_override(template), *extra, *(f"{k}={_value(v)}" for k, v in job.items())]
                columns = JobSpec.from_config(compose_config(overrides)).setting_columns()
                written.append({"job": " ".join(overrides), **columns})
    written = pd.DataFrame(written)
    filled = []
    for row in spec.row_specs():
        matched = select_cell(written, {**spec.where, **row.conditions})
        assert row.kind == "measured" and len(matched) == 1, (row.label, list(matched["job"]))
        filled.append(matched["job"].item())
    assert sorted(filled) == sorted(written["job"])  # no job left without a row


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("+paper=../../conf/config", "+paper=../../conf/config: leaves multirun_templates/paper (choose one of "),
        ("+methods=../paper/solvers", "+methods=../paper/solvers: leaves multirun_templates/methods (choose one of "),
        ("+paper=solvers,nosuch", "+paper=nosuch: is not a template of multirun_templates/paper (choose one of "),
    ],
)
def test_a_template_override_names_one_of_its_groups_templates(override, said):
    from replaceme_exp.runtime.composition import check_template_overrides, template_names

    line = check_template_overrides(["objective=ls", override])
    assert line is not None and line.startswith(said) and "solvers" in line and "\n" not in line
    assert "equal_compression" in template_names("methods")
    assert check_template_overrides(["+paper=solvers,regularization", "+methods=equal_compression", "cuts=[[1,2]]"]) is None
