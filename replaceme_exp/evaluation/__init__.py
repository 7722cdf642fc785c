"""Evaluation: held-out perplexity (``eval=heldout``, every suite), lm-eval suites (``harness``)."""

from replaceme_exp.evaluation.perplexity import perplexity

__all__ = ["perplexity"]
