"""Worked plug-ins a researcher copies: a model with named outputs, losses that read more than the logits, a metric
and a callback. Each module's docstring has the exact command; tests/test_examples.py runs each on digits."""
