"""Rematerialization (model.remat): activations recomputed in the backward pass instead of kept from the forward.

Keras' modes ("full", "larger_than", "list_of_layers") mark layers by Keras' own rule: build.py builds every model
inside `scope(model_config)`, a keras.RematScope. Keras' own recomputation is replaced (`install`): on the
TensorFlow backend it is tf.recompute_grad, which inside a tf.function refuses the keyword arguments every layer
is called with (training=...: "The custom_gradient decorator currently supports keywords arguments only when eager
execution is enabled"), and which would run a layer's state updates and random draws a second time.
`recomputed(fn)` binds the keywords and runs the recomputation in a keras.StatelessScope (BatchNorm's moving
statistics are updated once, in the forward pass) with the keyed random layers replaying the forward pass' draws.

"blocks" recomputes whole stretches of a functional model (`blocks`): between two tensors that every path from the
input to the output passes through (a residual block's input and output), only the stretch's input is kept.
"""

import contextlib
import fnmatch

import keras
import tensorflow as tf

from errors import ConfigError
from loops import private_apis
from loops.modeling import random_layers

KERAS_MODES = ("full", "larger_than", "list_of_layers")
MODES = ("",) + KERAS_MODES + ("blocks",)


class Patterns:
  """model.remat_layers for Keras' list_of_layers: `name in patterns` matches fnmatch patterns (conv2_block1_*).
  Not a list: Keras' attribute tracking would copy a list into a plain one."""

  def __init__(self, patterns):
    self.patterns = tuple(patterns)

  def __contains__(self, name):
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns)

  def __len__(self):
    return len(self.patterns)

  def __repr__(self):
    return repr(list(self.patterns))


def scope(model_config):
  """The keras.RematScope to build models in for model.remat (a null context when off or "blocks")."""
  mode = model_config.remat
  if mode not in KERAS_MODES:
    return contextlib.nullcontext()
  return keras.RematScope(mode=mode, output_size_threshold=int(model_config.remat_output_size),
                          layer_names=Patterns(model_config.remat_layers))


@contextlib.contextmanager
def _recomputation(draws):
  """A recomputation: state updates (BatchNorm's moving statistics) go nowhere, keyed layers replay `draws`."""
  with keras.StatelessScope(), random_layers.replaying(draws):
    yield


def recomputed(fn):
  """fn(*args, **kwargs) whose activations are recomputed in the backward pass (tf.recompute_grad over its float
  tensors, everything else bound): the recomputation updates no state and draws what the forward pass drew."""

  def call(*args, **kwargs):
    flat = tf.nest.flatten((args, kwargs))
    where = [i for i, value in enumerate(flat) if tf.is_tensor(value) and value.dtype.is_floating]
    if not where:
      return fn(*args, **kwargs)
    draws, runs = random_layers.snapshot(), []

    def run(*tensors):
      values = list(flat)
      for i, tensor in zip(where, tensors):
        values[i] = tensor
      inner_args, inner_kwargs = tf.nest.pack_sequence_as((args, kwargs), values)
      if not runs:  # the forward pass
        runs.append(True)
        return fn(*inner_args, **inner_kwargs)
      with _recomputation(draws):
        return fn(*inner_args, **inner_kwargs)

    return tf.recompute_grad(run)(*[flat[i] for i in where])

  return call


def install(model):
  """Every layer of `model` (itself and nested ones) Keras marked (built in `scope`) is recomputed by `recomputed`
  instead of Keras' tf.recompute_grad; Keras' rule still decides which layers. Returns how many layers it gave
  the call (marked or not: Keras decides per call)."""
  layers = [l for l in private_apis.all_layers(model) if not getattr(l.rematerialized_call, "framework", False)]
  for layer in layers:
    layer.rematerialized_call = _rematerialized_call(layer)  # an instance attribute: the class stays Keras'
  return len(layers)


def _rematerialized_call(layer):
  keras_choice = type(layer).rematerialized_call.__get__(layer)

  def rematerialized_call(layer_call, *args, **kwargs):
    # Keras' rule on specs of the arguments: "larger_than" traces the call for its output size, which fails on a
    # model's graph tensors; no keyed layer draws while it does.
    specs = tf.nest.map_structure(
        lambda x: keras.KerasTensor(x.shape, x.dtype.name) if tf.is_tensor(x) else x, (args, kwargs))
    with random_layers.replaying(None):
      chosen = keras_choice(layer_call, *specs[0], **specs[1])
    return layer_call if chosen is layer_call else recomputed(layer_call)

  rematerialized_call.framework = True
  return rematerialized_call


def refuse_unkeyed(model, name):
  """ConfigError when a layer of `model` draws from Keras' seed state: its recomputation would draw anew."""
  left = random_layers.unkeyed(model)
  if left:
    raise ConfigError(f"model.remat on model '{name}': {', '.join(l.path for l in left)} draw(s) from Keras' seed "
                      "state, which a recomputation would advance (other values than the forward pass); use the "
                      "keyed Dropout family or ctx.keyed_draws, or set model.remat=''")


def stretches(model):
  """[(input tensor, output tensor)] of `model` (functional, one input, one output) cut at every tensor that all
  paths from the input to the output pass through, in order; ConfigError for another kind of model."""
  try:
    inputs, outputs = model.inputs, model.outputs
  except (AttributeError, ValueError):
    inputs = outputs = None
  if not inputs or len(inputs) != 1 or len(outputs) != 1:
    raise ConfigError(f"model.remat='blocks' needs a functional model with one input and one output; "
                      f"'{model.name}' is not one: use 'full', 'larger_than' or 'list_of_layers'")
  produced, cuts = {id(inputs[0])}, [inputs[0]]
  last_use = _last_uses(model, outputs[0])
  for position, layer in enumerate(model.layers):
    if not any(id(t) in produced for t in tf.nest.flatten(layer.input)) and position:
      raise ConfigError(f"model.remat='blocks': layer '{layer.name}' of '{model.name}' is not in the order of "
                        "its inputs; use 'full', 'larger_than' or 'list_of_layers'")
    produced.add(id(layer.output))
    live = [t for t in _tensors(model) if id(t) in produced and last_use[id(t)] > position]
    if len(live) == 1 and live[0] is layer.output and position + 1 < len(model.layers):
      cuts.append(layer.output)
  cuts.append(outputs[0])
  return [(a, b) for a, b in zip(cuts, cuts[1:]) if a is not b]


def blocks(model):
  """[(input tensor, output tensor)] of `model`'s blocks: its stretches (`stretches`) joined until one ends after
  a layer with several inputs (a residual block's Add), the last one at the output."""
  grouped, start, joins = [], None, False
  for first, last in stretches(model):
    start = first if start is None else start
    joins = joins or any(len(tf.nest.flatten(l.input)) > 1 for l in keras.Model(first, last).layers)
    if joins:
      grouped.append((start, last))
      start, joins = None, False
  if start is not None:
    grouped.append((start, last))
  return grouped


def recompute_blocks(model):
  """Gives `model` a call that runs each of its blocks (`blocks`) as one recomputed stretch: only the blocks'
  inputs are kept for the backward pass. Its layers, variables and saved model stay as they were (each block is a
  functional model over the same layers). Returns how many blocks."""
  parts = [keras.Model(first, last, name=f"{model.name}_block{i}") for i, (first, last) in enumerate(blocks(model))]

  def call(inputs, training=None, mask=None):
    x = inputs
    for part in parts:
      x = recomputed(part)(x, training=training)
    return x

  call.blocks = len(parts)
  model.call = call  # an instance attribute: the class (and so the saved model) stays Keras'
  return len(parts)


def _tensors(model):
  return [layer.output for layer in model.layers]


def _last_uses(model, output):
  """{id(tensor): the position of the last layer that reads it (past the end for the model's output)}."""
  last = {id(output): len(model.layers)}
  for position, layer in enumerate(model.layers):
    for tensor in tf.nest.flatten(layer.input):
      last[id(tensor)] = max(last.get(id(tensor), -1), position)
  return last
