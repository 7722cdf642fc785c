"""What the unit and integration tests of selection share: fixtures, builders and constants."""

from __future__ import annotations


NUM_LAYERS = 8
