"""The LiteRT export (export_tflite=True): workdir/export/model.tflite, one signature `serving_default` whose
inputs and outputs carry the serving SavedModel's names, its batch of any size.

Converted as Keras 3's own LiteRT export does: an ExportArchive SavedModel (in a local temporary directory) through
`tf.lite.TFLiteConverter.from_saved_model`, with LiteRT's built-in ops only (no TF Select: the plain
`ai_edge_litert` interpreter runs it). `from_concrete_functions` with a Keras 3 model as the trackable object
converts, but its weights came out uninitialised (NaN probabilities, TF 2.21).
"""

import contextlib
import os
import re
import sys
import tempfile

from absl import logging
import keras
import tensorflow as tf

from loops.modeling import serving


class Unconvertible(Exception):
  """The converter refused the model: the message names the ops LiteRT lacks (or the converter's first line)."""


def write_tflite(models, fn, input_signature, path):
  """Writes fn (on input_signature) as a .tflite file at `path` (through tf.io.gfile); returns the path.
  models: every Keras model fn calls. Raises Unconvertible with one line when the converter refuses."""
  with tempfile.TemporaryDirectory() as saved_model:
    archive = keras.export.ExportArchive()
    for model in models:
      archive.track(model)
    archive.add_endpoint(serving.SIGNATURE, fn, input_signature=input_signature)
    archive.write_out(saved_model, verbose=False)
    try:
      with _stderr_to_debug_log():
        flat = tf.lite.TFLiteConverter.from_saved_model(saved_model).convert()
    except Exception as e:  # pylint: disable=broad-except  # ConverterError is not exported; its text names the ops
      raise Unconvertible(refusal(str(e))) from e
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(flat)
  return path


def missing_ops(message):
  """The TensorFlow ops a converter error says LiteRT lacks, sorted (its "TF Select ops:" / "Custom ops:" lists,
  else its "'tf.X' op is neither a custom op nor a flex op" lines)."""
  listed = re.findall(r"(?:TF Select|Custom) ops: ([\w, ]+)", message)
  named = re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", message)
  return sorted({op.strip() for line in listed for op in line.split(",") if op.strip()} | set(named))


def refusal(message):
  """One line for a converter error: the ops LiteRT lacks, else the error's first non-empty line."""
  ops = missing_ops(message)
  if ops:
    return f"ops LiteRT lacks: {', '.join(ops)}"
  first = next((line.strip() for line in message.splitlines() if line.strip()), "no message")
  return f"the converter failed: {first[:300]}"


@contextlib.contextmanager
def _stderr_to_debug_log():
  """The process's stderr (fd 2) held while inside, then logged at debug level: the converter's MLIR
  diagnostics (every refused op with its Python frames) would print dozens of lines around the one warning."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      held.seek(0)
      text = held.read().decode(errors="replace").strip()
      if text:
        logging.debug("the LiteRT converter said:\n%s", text)
