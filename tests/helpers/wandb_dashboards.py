"""What the unit, integration and e2e tests of wandb dashboards share: fixtures, builders and constants."""

from __future__ import annotations

import pandas as pd


def sweep_rows() -> pd.DataFrame:
    base = {"sweep_id": "2026-01-01_10-00-00", "sweep_group": "sweep 2026-01-01_10-00-00", "model": "tiny"}
    return pd.DataFrame(
        [
            {
                **base,
                "experiment": e,
                "objective": o,
                "alpha": a,
                "ppl_heldout": p,
                "ppl_heldout_baseline": 20.0,
                "status": status,
            }
            for e, o, a, p, status in [
                ("replaceme_ls", "ls", 0.0, 30.0, "finished"),
                ("uidl_baseline", "identity", 0.0, 40.0, "finished"),
                ("uidl_baseline", "identity", None, None, "failed"),
            ]  # fmt: skip
        ]
    )
