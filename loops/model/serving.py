"""The serving export: a SavedModel whose `serving_default` signature takes raw images (the source's dtype and
shape, before preprocessing), runs the run's eval preprocessing inside and returns `probabilities` (softmax of the
logits, float32) and `classes` (the top class, int64).

Written with Keras 3's `keras.export.ExportArchive` (its supported SavedModel path for TensorFlow: it tracks the
Keras variables as TensorFlow variables, also a MirroredStrategy's, and calls `tf.saved_model.save`, which takes
`tf.io.gfile` paths). Keras 3's `model.save` writes only `.keras` files, and a bare `tf.Module` around a Keras 3
model would have to track its variables by hand.
"""

import keras
import tensorflow as tf

SIGNATURE = "serving_default"
INPUT = "images"


def write_saved_model(model, preprocess, image_spec, path):
  """Writes the SavedModel of `model` at `path`: serving_default(images) -> {probabilities, classes}.

  preprocess: fn(raw images) -> the model's float inputs (the eval's own preprocessing); image_spec: the raw
  images' tf.TensorSpec ([None, H, W, C], uint8 for every built-in source).
  """
  archive = keras.export.ExportArchive()
  archive.track(model)
  archive.add_endpoint(SIGNATURE, serving_function(model, preprocess),
                       input_signature=[tf.TensorSpec(image_spec.shape, image_spec.dtype, name=INPUT)])
  archive.write_out(path, verbose=False)
  return path


def serving_function(model, preprocess):
  """fn(raw images) -> {"probabilities": float32 softmax, "classes": int64 argmax}, in inference mode. Logits
  of a mixed-precision model (float16/bfloat16) are cast to float32 first, as the eval does."""

  def serve(images):
    outputs = model(preprocess(images), training=False)
    logits = tf.cast(outputs["logits"] if isinstance(outputs, dict) else outputs, tf.float32)
    return {"probabilities": tf.nn.softmax(logits), "classes": tf.argmax(logits, axis=-1, output_type=tf.int64)}

  return serve
