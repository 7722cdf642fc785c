"""What the unit and integration tests of protocol share: fixtures, builders and constants."""

from __future__ import annotations


def _without_gpu_checks(monkeypatch):
    """The 4-bit checks a machine without bitsandbytes and a GPU fails, passed (what follows them is tested)."""
    import replaceme_exp.pipeline.rules as rules
    from replaceme_exp.models import loading

    monkeypatch.setattr(loading, "check_nf4_capture", lambda cfg: None)
    monkeypatch.setattr(rules, "check_nf4_capture", lambda cfg: None)
