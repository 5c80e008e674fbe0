"""Evaluation and reporting: perplexity, report.md, plots."""

from gapprune.evaluate.perplexity import PerplexityResult, perplexity

__all__ = ["PerplexityResult", "perplexity"]
