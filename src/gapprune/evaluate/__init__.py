"""Evaluation and reporting: perplexity (`perplexity.py`), zero-shot tasks, HumanEval, serving checks, report.md,
plots. Import from the modules: the package exports no name, so `import gapprune.evaluate.perplexity as m` gives
the module."""
