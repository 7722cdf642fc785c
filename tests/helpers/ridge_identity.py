"""What the unit and integration tests of ridge identity share: fixtures, builders and constants."""

from __future__ import annotations


CUT, FOLDS, D = (2, 4), 4, 32
