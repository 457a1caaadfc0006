"""errors.py: the one line a user reads of an error, for a traced function's error too (its cause and the user's
file and line, not "in user code:")."""

import tensorflow as tf

from errors import first_line


def test_a_traced_functions_error_is_its_cause_and_the_users_line():
  @tf.function
  def serve(x):
    if x.shape.rank != 2:
      raise ValueError(f"expected a batch of vectors, got rank {x.shape.rank}")
    return x

  try:
    serve(tf.zeros([3]))
  except ValueError as error:
    assert str(error).startswith("in user code:")
    line = first_line(error)
  assert line.startswith("expected a batch of vectors, got rank 1 (in ") and line.endswith(
      f"tests/test_errors.py:{serve.python_function.__code__.co_firstlineno + 3})"), line


def test_a_plain_error_is_its_first_line():
  assert first_line(RuntimeError("\n  the first\nthe second")) == "the first"
  assert first_line(KeyError()) == "KeyError"
