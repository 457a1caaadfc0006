"""Max-pooling ties: what rounding can do through a discontinuity. A window whose two largest inputs are within
rounding of each other sends its gradient to whichever one the step's rounding makes larger; when another
summation order (2 replicas, 2 worker processes) flips it, the gradient of that window goes to another position,
a difference far larger than the rounding that decided it. Measured on digits (FixMatch, 2 workers, step 51): one
window of the conv2 output 7.6e-7 apart (relative) moved Adam's momentum by 6.5e-4 of its update, while the same
step in float64 differed by under 1e-5.

So where a step exceeds its floor and the models hold max pooling, the check takes that step once more on one
device with every near tie flipped (the second largest raised just above the largest, the forward values moved
by ~1e-6 of themselves, gradients unchanged): what that changes is what ties can explain, added once to the floor's
explanation (every near tie flipped at once is already more than rounding flips: not taken 10x). A window is near a tie
when its two largest inputs are within the least difference judged (rounding.MINIMUM: 1e-5 of the larger in
float32). MaxPooling1D and MaxPooling2D are flipped; 3-D and global max pooling are not.
"""

import keras
import tensorflow as tf

from loops import private_apis

MAX_POOLS = (keras.layers.MaxPooling1D, keras.layers.MaxPooling2D)


def max_pools(models):
  """The max-pooling layers ties can flip in {name: keras model}."""
  return [layer for model in models.values() for layer in private_apis.all_layers(model, include_self=False)
          if isinstance(layer, MAX_POOLS)]


def flipped(x, pool_size, strides, padding, tolerance):
  """x (NHWC) with each window's second largest raised just above its largest where they are within
  tolerance x |largest|: the gradient then goes to the other position; x's gradient unchanged."""
  ksize, step = [1, *pool_size, 1], [1, *strides, 1]
  padding = padding.upper()
  found = tf.cast(tf.stop_gradient(x), tf.float32)
  top, first = tf.nn.max_pool_with_argmax(found, ksize, step, padding, include_batch_in_index=True)
  flat = tf.reshape(found, [-1])
  lowest = tf.fill([tf.size(first)], float("-inf"))
  masked = tf.reshape(tf.tensor_scatter_nd_update(flat, tf.reshape(first, [-1, 1]), lowest), tf.shape(found))
  second, at = tf.nn.max_pool_with_argmax(masked, ksize, step, padding, include_batch_in_index=True)
  margin = tf.maximum(tf.abs(top) * 2.0**-20, 1e-30)
  near = tf.logical_and(top - second <= tolerance * tf.abs(top), tf.not_equal(first, at))
  raised = tf.where(near, top - second + margin, 0.0)
  delta = tf.tensor_scatter_nd_add(tf.zeros_like(flat), tf.reshape(at, [-1, 1]), tf.reshape(raised, [-1]))
  return x + tf.cast(tf.reshape(delta, tf.shape(x)), x.dtype)


def flipping_call(layer, tolerance):
  """The layer's call with its inputs' near ties flipped first (2-D channels-last pools; 1-D and channels-first
  through a reshape or transpose)."""
  call = layer.call
  one_d = isinstance(layer, keras.layers.MaxPooling1D)
  first = layer.data_format == "channels_first"
  pool_size = (1, *layer.pool_size) if one_d else tuple(layer.pool_size)
  strides = (1, *layer.strides) if one_d else tuple(layer.strides)

  def flipping(inputs, *args, **kwargs):
    x = tf.transpose(inputs, [0, *range(2, inputs.shape.rank), 1]) if first else inputs
    x = x[:, None] if one_d else x
    x = flipped(x, pool_size, strides, layer.padding, tolerance)
    x = x[:, 0] if one_d else x
    x = tf.transpose(x, [0, x.shape.rank - 1, *range(1, x.shape.rank - 1)]) if first else x
    return call(x, *args, **kwargs)

  return flipping


def flip_ties(models, tolerance):
  """Every max pool of the models flips its near ties from now on (set before the step is traced); their count."""
  pools = max_pools(models)
  for layer in pools:
    layer.call = flipping_call(layer, tolerance)
  return len(pools)
