"""Quality measures for lossy methods: ROUGE on XSum, HumanEval pass@1, and perplexity through the runtime.

Import the submodules directly (``studylib.eval.rouge``, ``.humaneval``, ``.perplexity``); this package
imports nothing heavy on its own.
"""
