"""Row columns come from the schema (issue 51): a field that declares ``key(column=...)`` records its value
as given, in every job's row settings; the estimator's and the effective settings' columns are theirs."""

from __future__ import annotations

import dataclasses
from typing import Optional

from helpers.config import compose_config

from replaceme_exp.config import schema
from replaceme_exp.config.store import group_shapes
from replaceme_exp.pipeline.spec import JobSpec


@schema.Group
class Base:
    ratio: float = schema.key(0.0, column="the_ratio")
    count: int = schema.key(3, column="the_count")
    quiet: int = schema.key(1)


@schema.Group
class Wider(Base):
    extra: Optional[str] = schema.key(None, column="the_extra")


def test_declared_columns_take_the_fields_type_and_none_where_the_shape_lacks_the_field():
    got = schema.declared_columns(Base(ratio=2, count=5), (Base, Wider))
    assert got == {"the_ratio": 2.0, "the_count": 5, "the_extra": None} and isinstance(got["the_ratio"], float)
    assert list(got) == ["the_ratio", "the_count", "the_extra"]
    assert schema.declared_columns(Wider(extra="x"), (Base, Wider))["the_extra"] == "x"


def test_every_column_the_schema_declares_is_in_the_row_settings_with_its_value():
    spec = JobSpec.from_config(compose_config(["objective=cosine"]))
    row, c = spec.setting_columns(), spec.config
    sections = {"": (c, (schema.JobConfig,)), "model": (c.model, None), "calibration": (c.calibration, None)}
    sections |= {g: (getattr(c, g), None) for g in ("objective", "healing", "eval", "capture")}
    shapes = group_shapes()
    declared = 0
    for group, (option, own) in sections.items():
        for shape in own or shapes[group]:
            for f in dataclasses.fields(shape):
                if (column := f.metadata.get("column")) is not None:
                    declared += 1
                    assert column in row, (group, f.name, column)
                    if isinstance(option, shape):
                        assert row[column] == getattr(option, f.name), (group, f.name)
    assert declared >= 20
    assert {k: row[k] for k in spec.requirements.columns()} == spec.requirements.columns()
    assert {k: row[k] for k in spec.effective.columns()} == spec.effective.columns()
    assert "selects_by_ls" not in row and "precision_acts" not in row  # they steer the job, no setting of the row
