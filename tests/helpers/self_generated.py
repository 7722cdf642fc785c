"""What the unit and integration tests of self generated share: fixtures, builders and constants."""

from __future__ import annotations

import json


def slimorca_file(path, n=6):
    """Records in SlimOrca's format (ShareGPT turns: system, human, gpt)."""
    with open(path, "w") as f:
        for i in range(n):
            turns = [
                {"from": "system", "value": "You are a helpful assistant."},
                {"from": "human", "value": f"Question number {i}: how do tides form?"},
                {"from": "gpt", "value": f"SlimOrca's own answer {i}."},
            ]
            f.write(json.dumps({"conversations": turns}) + "\n")
    return path
