"""Refactors change no result: the config hash, the setting hash and the row's setting columns of every
shipped option, preset, template job and special spelling, and the line that refuses each bad one, equal
``tests/golden/identity.json``; a change made on purpose is named in ``tests/golden/identity_log.json``
(``python tests/golden/compositions.py --change <tag> --why "..."``)."""

from __future__ import annotations

import json

import pytest
from golden.compositions import (
    IDENTITY,
    LOG,
    all_compositions,
    checked_compositions,
    composed,
    current_identity,
    hashes_of,
    key,
)


pytestmark = pytest.mark.slow
SHARDS = 4


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads(IDENTITY.read_text())


@pytest.fixture(scope="module")
def log() -> list[dict]:
    return json.loads(LOG.read_text())


def test_every_composition_is_pinned(pinned):
    assert {key(o) for o in all_compositions()} == set(pinned)


def test_every_change_is_named_once_and_says_why(log):
    names = [entry["change"] for entry in log]
    assert len(names) == len(set(names))
    assert all(entry["why"].strip() for entry in log)
    assert all(set(entry) == {"change", "why", "moved", "added", "retired", "described"} for entry in log)


def test_the_log_ends_where_the_pinned_identities_are(log, pinned):
    """The last change that moved or added a composition left it with the hashes pinned now (or its
    refusal), and nothing retired is still pinned unless a later change added it back."""
    latest: dict[str, dict | None] = {}
    for entry in log:
        latest.update({name: moved["to"] for name, moved in entry["moved"].items()})
        latest.update(dict.fromkeys(entry["added"]))
        latest.update({name: "retired" for name in entry["retired"]})
    for name, last in latest.items():
        if last == "retired":
            assert name not in pinned, f"{name}: retired but pinned"
        elif last is not None and "refused" not in last:  # added: its identity is the pinned one
            assert hashes_of(pinned[name]) == last, name


@pytest.mark.parametrize("shard", range(SHARDS))
def test_identity_of_every_composition_is_unchanged(pinned, tmp_path, shard):
    """Every ``SHARDS``-th composition from ``shard`` on (the shards run on parallel test workers)."""
    changed = []
    for overrides, cfg in composed(checked_compositions()[shard::SHARDS], str(tmp_path)):
        now, then = current_identity(cfg, str(tmp_path)), pinned[key(overrides)]
        if now != then:
            changed.append((key(overrides), differences(now, then), now, then))
    assert not changed, (
        f"{len(changed)} changed, first: {changed[0][0]}: {changed[0][1]}\nnow {changed[0][2]}\nthen {changed[0][3]}"
    )


def differences(now: dict, then: dict) -> list[str]:
    """The keys (hashes, refusal, setting columns) in which two identities differ."""
    flat = [{**{k: v for k, v in i.items() if k != "row_settings"}, **i.get("row_settings", {})} for i in (now, then)]
    return sorted(k for k in set(flat[0]) | set(flat[1]) if flat[0].get(k, "<absent>") != flat[1].get(k, "<absent>"))
