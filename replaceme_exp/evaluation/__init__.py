"""Evaluation: held-out perplexity (``eval=quick``)."""

from replaceme_exp.evaluation.perplexity import perplexity

__all__ = ["perplexity"]
