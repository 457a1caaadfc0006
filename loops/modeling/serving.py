"""The serving export: a SavedModel whose `serving_default` signature takes raw images (the source's dtype and
shape, before preprocessing), runs the run's eval preprocessing inside and returns `probabilities` (softmax of the
logits, float32) and `classes` (the top class, int64). A task's (`write_task_saved_model`) takes the task's features
and returns its predict_step's outputs.

Written with Keras 3's `keras.export.ExportArchive` (its supported SavedModel path for TensorFlow: it tracks the
Keras variables as TensorFlow variables, also a MirroredStrategy's, and calls `tf.saved_model.save`, which takes
`tf.io.gfile` paths). Keras 3's `model.save` writes only `.keras` files, and a bare `tf.Module` around a Keras 3
model would have to track its variables by hand.
"""

import re

import keras
import tensorflow as tf

SIGNATURE = "serving_default"
INPUT = "images"
_RAISED = re.compile(r"^\s*(\w+(?:Error|Exception)): ", re.M)  # a traced error's cause, under its frames


def write_saved_model(model, preprocess, image_spec, path, max_value=255):
  """Writes the SavedModel of `model` at `path`: serving_default(images) -> {probabilities, classes}.

  preprocess: fn(raw images) -> the model's float inputs (the eval's own preprocessing); image_spec: the raw
  images' tf.TensorSpec ([None, H, W, C], uint8 for every built-in source); max_value: their largest value (the
  source's: 16 for digits). The signature takes float32 of any
  shape (uint8 arrays convert exactly) and checks it inside, so that a [0, 1]-scaled float image or a wrong shape is
  a short error instead of a silent truncation to uint8 or a TypeError printing the whole array.
  """
  archive = keras.export.ExportArchive()
  archive.track(model)
  archive.add_endpoint(SIGNATURE, serving_function(model, preprocess, image_spec, max_value),
                       input_signature=[tf.TensorSpec(None, tf.float32, name=INPUT)])
  archive.write_out(path, verbose=False)
  return path


def checked_images(images, image_spec, max_value=255):
  """`images` (float32, any shape) as the raw images of `image_spec`, after in-graph checks that fail with a short
  InvalidArgumentError: the shape [batch, H, W, C]; for uint8 sources whole values in 0..max_value."""
  height, width, channels = (int(d) for d in image_spec.shape[1:])
  shape_text = tf.strings.reduce_join(tf.strings.as_string(tf.shape(images)), separator=",")
  shape_check = tf.debugging.Assert(
      tf.strings.regex_full_match(shape_text, rf"\d+,{height},{width},{channels}"),
      [f"images must be a batch of shape [N, {height}, {width}, {channels}], got shape", tf.shape(images)],
      summarize=8)
  with tf.control_dependencies([shape_check]):  # the values are looked at only in the right shape
    images = tf.ensure_shape(tf.identity(images), [None, height, width, channels])
  if image_spec.dtype == tf.uint8:
    whole = tf.reduce_all(tf.equal(images, tf.round(images)))
    in_range = tf.logical_and(tf.reduce_all(images >= 0), tf.reduce_all(images <= max_value))
    value_check = tf.debugging.Assert(tf.logical_and(whole, in_range), [
        f"images must hold the raw pixel values the model trained on: whole numbers in 0..{max_value:g} (not images "
        "scaled to [0, 1]); got min, max", tf.reduce_min(images), tf.reduce_max(images)], summarize=2)
    with tf.control_dependencies([value_check]):
      images = tf.identity(images)
  return tf.cast(images, image_spec.dtype)


def serving_function(model, preprocess, image_spec, max_value=255):
  """fn(images) -> {"probabilities": float32 softmax, "classes": int64 argmax}, in inference mode, on images
  checked by `checked_images`. Logits of a mixed-precision model (float16/bfloat16) are cast to float32 first, as
  the eval does."""

  def serve(images):
    return on_one_row_at_least(lambda x: classified(model, preprocess(x)),
                               checked_images(images, image_spec, max_value))

  return serve


def classified(model, inputs):
  """{"probabilities", "classes"} of `model` on its (preprocessed) inputs, in inference mode."""
  outputs = model(inputs, training=False)
  logits = tf.cast(outputs["logits"] if isinstance(outputs, dict) else outputs, tf.float32)
  return {"probabilities": tf.nn.softmax(logits), "classes": tf.argmax(logits, axis=-1, output_type=tf.int64)}


def lite_classifier(model, preprocess, image_spec):
  """(fn, input signature) for LiteRT: float32 raw images [None, H, W, C] -> the eval preprocessing -> classified,
  without checked_images' in-graph checks (LiteRT has no Assert or string ops)."""
  spec = tf.TensorSpec([None] + list(image_spec.shape[1:]), tf.float32, name=INPUT)
  return (lambda images: classified(model, preprocess(tf.cast(images, image_spec.dtype)))), [spec]


def on_one_row_at_least(fn, inputs):
  """fn(inputs) for a batch of any size, an empty one included: its outputs for no rows (some kernels, e.g. a
  convolution on CPU, refuse a batch of 0, so fn runs on one row of zeros and the result is cut to none)."""
  rows = tf.shape(tf.nest.flatten(inputs)[0])[0]
  padded = tf.nest.map_structure(
      lambda x: tf.cond(rows > 0, lambda: x, lambda: tf.zeros(tf.concat([[1], tf.shape(x)[1:]], 0), x.dtype)), inputs)
  return tf.nest.map_structure(lambda y: y[:rows], fn(padded))


def batched(features_spec):
  """The spec of a batch of `features_spec` examples (a tensor's or a flat dict's), its batch of any size."""
  return tf.nest.map_structure(lambda s: tf.TensorSpec([None] + list(s.shape), s.dtype, name=None), features_spec)


def write_task_saved_model(models, predict, features_spec, path):
  """A task's serving: serving_default(features) -> predict(features), the task's predict_step outputs (a batch
  of any size, an empty one included). models: every model predict may call (their variables are saved);
  features_spec: one example's spec (a tensor or a flat dict)."""
  archive = keras.export.ExportArchive()
  for model in models:
    archive.track(model)
  archive.add_endpoint(SIGNATURE, lambda features: on_one_row_at_least(predict, features),
                       input_signature=[batched(features_spec)])
  archive.write_out(path, verbose=False)
  return path


def keras_file_problem(model):
  """Why `model` cannot be written as a .keras file (Keras needs its config), or None."""
  try:
    keras.saving.serialize_keras_object(model)
    model.get_config()
  except Exception as e:  # pylint: disable=broad-except  # NotImplementedError, TypeError: Keras' own words
    return f"{type(e).__name__}: {_words(e, 'no get_config')}"
  return None


def _words(error, fallback):
  """Keras' message in one line: its sentences up to the first blank line (its messages start with a newline and
  go on with an example), at most 300 characters; `fallback` for an empty one."""
  paragraph = str(error).strip().split("\n\n")[0]
  return " ".join(paragraph.split())[:300] or fallback


def serving_problem(predict, features_spec):
  """Why predict (a task's predict_step for serving) cannot be traced on a batch of `features_spec` examples, or
  returns no {name: tensor}; None when it serves."""
  try:
    outputs = tf.function(predict).get_concrete_function(batched(features_spec)).structured_outputs
  except Exception as e:  # pylint: disable=broad-except  # the task's or model's own words, on one line
    return _traced_words(e)
  if not isinstance(outputs, dict) or not outputs or not all(isinstance(v, tf.Tensor) for v in outputs.values()):
    return f"predict_step returned {type(outputs).__name__}, not {{name: per-example tensor}}"
  return None


def _traced_words(error):
  """A tracing error in one line: under AutoGraph's "in user code:" and its frames, the error raised inside (Keras'
  "Exception encountered when calling ..." preamble and colour codes dropped)."""
  text = str(error)
  raised = list(_RAISED.finditer(text)) if text.lstrip().startswith("in user code:") else []
  if not raised:
    return f"{type(error).__name__}: {_words(error, 'no message')}"
  inner = re.sub(r"\x1b\[\d*m", "", text[raised[-1].end():])
  paragraphs = [p for p in re.split(r"\n\s*\n", inner)
                if p.strip() and not p.strip().startswith("Exception encountered when calling")]
  return f"{raised[-1].group(1)}: {' '.join(paragraphs[0].split())[:300] if paragraphs else 'no message'}"
