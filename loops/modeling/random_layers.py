"""Random layers that draw per example, keyed on (seed, step, layer, call, the example's row of the global batch).

Keras 3 draws a layer's noise from its SeedGenerator, one state mirrored on every replica: under a strategy each
replica draws the SAME mask for its own rows (2 replicas: one mask for both halves of the global batch), so N
replicas train otherwise than one, and the draws restart from the layer's (uncheckpointed) state on resume.
`key(model, ...)` gives Dropout (SpatialDropout1D/2D/3D too), GaussianNoise, GaussianDropout and AlphaDropout a
call that, inside a framework step (`keyed(ctx)`), draws each example's noise by the rule of ctx.normal: keyed on
the step and on the example's row as one device reads the global batch, so an example gets the same mask however
the batch is split over replicas, workers and micro-batches, and a resumed run draws what an uninterrupted one
did. Outside a step (a user's own eager call) the layer is Keras' own. The class, config and saved model stay
Keras'. Cost: each replica draws the noise of the whole global batch and keeps its rows (as ctx.normal does).

Other layers with a seed generator (RandomFlip, RandomCrop and the other augmentation layers, an RNN's dropout)
keep Keras' draw: `unkeyed(model)` names them, and the replica check names them when it fails.
"""

import contextlib
import inspect
import math
import threading
import zlib

import keras
import tensorflow as tf

from loops import private_apis

_ACTIVE = threading.local()  # MirroredStrategy runs each replica's step in a thread of its own
SPATIAL_DROPOUTS = (keras.layers.SpatialDropout1D, keras.layers.SpatialDropout2D, keras.layers.SpatialDropout3D)
LAYER_DOMAIN = 0x6C61796572  # keeps layer draws apart from a task's ctx.normal(salt=...) draws
ALPHA, SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946  # SELU's (AlphaDropout)


@contextlib.contextmanager
def keyed(ctx):
  """Inside: keyed layers called with training=True draw through `ctx` (a StepContext), each call its own key."""
  previous = getattr(_ACTIVE, "scope", None)
  _ACTIVE.scope = (ctx, {})
  try:
    yield
  finally:
    _ACTIVE.scope = previous


def snapshot():
  """The keyed draws' state now (the step's context and how often each layer drew), or None outside a step: what
  `replaying` restores so a recomputation (loops/modeling/remat.py) draws what the forward pass drew."""
  scope = getattr(_ACTIVE, "scope", None)
  return None if scope is None else (scope[0], dict(scope[1]))


@contextlib.contextmanager
def replaying(state):
  """Inside: keyed layers draw from `state` (a snapshot) anew, on a copy: the same keys as after the snapshot."""
  previous = getattr(_ACTIVE, "scope", None)
  _ACTIVE.scope = None if state is None else (state[0], dict(state[1]))
  try:
    yield
  finally:
    _ACTIVE.scope = previous


def active_context():
  """The StepContext of the step being traced in this thread (inside keyed), else None."""
  scope = getattr(_ACTIVE, "scope", None)
  return scope[0] if scope else None


def key(model, model_name, seed):
  """Gives every keyable random layer of `model` (nested ones too) the keyed call; returns their paths."""
  keyed_paths = []
  for index, layer in enumerate(private_apis.all_layers(model, include_self=False)):
    noise = _noise_of(layer)
    if noise is not None and not getattr(layer.call, "keyed", False):
      salt = zlib.crc32(f"{model_name}/{index}".encode())
      layer.call = _keyed_call(layer, noise, seed, salt)  # an instance attribute: the class stays Keras'
      keyed_paths.append(layer.path)
  return keyed_paths


def unkeyed(model):
  """`model`'s layers that draw from a Keras SeedGenerator and have no keyed call."""
  return [layer for layer in private_apis.all_layers(model, include_self=False)
          if not getattr(layer.call, "keyed", False)
          and any(isinstance(value, keras.random.SeedGenerator) for value in vars(layer).values())]


def can_turn_off(layer):
  """Whether in_inference_mode can stop `layer` drawing: its call takes `training`."""
  return "training" in inspect.signature(type(layer).call).parameters


def in_inference_mode(layer):
  """Makes `layer` draw nothing: it runs as in inference, whatever `training` says (the replica check's test of
  whether the layer is what makes replicas differ)."""
  keras_call = type(layer).call.__get__(layer)
  layer.call = lambda inputs, *args, training=None, **kwargs: keras_call(inputs, *args, training=False, **kwargs)


def _noise_of(layer):
  """fn(layer, inputs, uniform, normal) -> outputs for the layer classes drawn here, else None. Subclasses with a
  call of their own keep it."""
  for cls, noise in _NOISE.items():
    if isinstance(layer, cls) and type(layer).call is cls.call:
      return noise
  if isinstance(layer, keras.layers.Dropout) and type(layer).call in _SPATIAL_CALLS:
    return _dropout
  return None


def _keyed_call(layer, noise, seed, salt):
  keras_call = type(layer).call.__get__(layer)

  def call(inputs, training=False):
    scope = getattr(_ACTIVE, "scope", None)
    if not training or scope is None:
      return keras_call(inputs, training=training)
    ctx, calls = scope
    index = calls[salt] = calls.get(salt, -1) + 1  # a second call in the same step draws anew
    key_seed = tf.random.experimental.stateless_fold_in(
        tf.random.experimental.stateless_fold_in(tf.stack([ctx.step, tf.constant(LAYER_DOMAIN, tf.int64)]), seed),
        salt * 64 + index)
    draw = lambda fn: lambda shape: ctx.keyed_draws(fn, shape, key_seed)
    return noise(layer, inputs, draw(tf.random.stateless_uniform), draw(tf.random.stateless_normal))

  call.keyed = True
  return call


def _noise_shape(layer, inputs):
  if isinstance(layer, SPATIAL_DROPOUTS):  # one draw per (row, channel): [rows, 1, ..., channels]
    shape = tf.shape(inputs)
    ones = [1] * (len(inputs.shape) - 2)
    first = getattr(layer, "data_format", "channels_last") == "channels_first"
    return [shape[0], shape[1], *ones] if first else [shape[0], *ones, shape[-1]]
  if layer.noise_shape is None:
    return tf.shape(inputs)
  return [tf.shape(inputs)[i] if d is None else d for i, d in enumerate(layer.noise_shape)]


def _dropout(layer, inputs, uniform, normal):
  if layer.rate <= 0:
    return inputs
  kept = tf.cast(uniform(_noise_shape(layer, inputs)) >= layer.rate, inputs.dtype)
  return inputs * kept / tf.cast(1.0 - layer.rate, inputs.dtype)


def _gaussian_noise(layer, inputs, uniform, normal):
  if layer.stddev <= 0:
    return inputs
  return inputs + tf.cast(layer.stddev * normal(tf.shape(inputs)), inputs.dtype)


def _gaussian_dropout(layer, inputs, uniform, normal):
  if layer.rate <= 0:
    return inputs
  stddev = math.sqrt(layer.rate / (1.0 - layer.rate))
  return inputs * tf.cast(1.0 + stddev * normal(tf.shape(inputs)), inputs.dtype)


def _alpha_dropout(layer, inputs, uniform, normal):
  if layer.rate <= 0:
    return inputs
  alpha_p = -ALPHA * SCALE
  kept = tf.cast(uniform(_noise_shape(layer, inputs)) >= layer.rate, inputs.dtype)
  a = ((1 - layer.rate) * (1 + layer.rate * alpha_p ** 2)) ** -0.5
  b = -a * alpha_p * layer.rate
  return a * (inputs * kept + alpha_p * (1 - kept)) + b


_NOISE = {
    keras.layers.GaussianNoise: _gaussian_noise,
    keras.layers.GaussianDropout: _gaussian_dropout,
    keras.layers.AlphaDropout: _alpha_dropout,
    keras.layers.Dropout: _dropout,
}
_SPATIAL_CALLS = tuple({cls.call for cls in (keras.layers.SpatialDropout1D, keras.layers.SpatialDropout2D,
                                             keras.layers.SpatialDropout3D)})
