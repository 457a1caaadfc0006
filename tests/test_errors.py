"""errors.py: the one line a user reads of an error, for a traced function's error too (its cause and the user's
file and line, not "in user code:")."""

import tensorflow as tf

from errors import described, first_line


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


def test_described_is_the_type_and_the_first_line_or_the_type_alone():
  assert described(RuntimeError("\n  the first\nthe second")) == "RuntimeError: the first"
  assert described(KeyError()) == "KeyError"
  oom = "Graph execution error:\n\nOOM when allocating tensor with shape[512,64,112,112]\n\t [[{{node conv1}}]]"
  assert described(tf.errors.ResourceExhaustedError(None, None, oom)) == (
      "ResourceExhaustedError: OOM when allocating tensor with shape[512,64,112,112]")


def test_a_graph_execution_error_is_its_cause_with_or_without_the_ops_frames():
  """A real one (a dataset read in a tf.function), and both layouts TensorFlow gives one error: with the frames where
  the op was defined, or the cause right after the header."""
  def failing_in_a_function():
    iterator = iter(tf.data.Dataset.from_tensor_slices([1.0, 0.0]).map(
        lambda x: tf.debugging.check_numerics(tf.math.log(x), "a row is not positive")))

    @tf.function
    def take(it):
      return next(it)
    take(iterator)
    take(iterator)

  try:
    failing_in_a_function()
  except tf.errors.InvalidArgumentError as error:
    text = str(error)
    line = first_line(error)
  assert text.startswith("Graph execution error:") and "[[" in text, text
  assert "a row is not positive" in line and "Graph execution" not in line, line
  frames = ("Graph execution error:\n\nDetected at node IteratorGetNext defined at (most recent call last):\n  File "
            "\"/u/train.py\", line 23, in <module>\n\ncorrupted record at 5085\n\t [[{{node IteratorGetNext}}]]")
  assert first_line(tf.errors.DataLossError(None, None, frames)) == "corrupted record at 5085"
  plain = "Graph execution error:\n\nCollective ops is aborted by: recvmsg:Connection reset by peer\nAdditional"
  assert first_line(tf.errors.UnavailableError(None, None, plain)) == (
      "Collective ops is aborted by: recvmsg:Connection reset by peer")
