"""What the unit and e2e tests of paper tables share: fixtures, builders and constants."""

from __future__ import annotations

from replaceme_exp.reporting.paper_records import paper_records


LLAMA2_TABLE_COLUMNS = paper_records()["columns"]["llama2_table"]  # [header, metric] pairs
