"""train.freeze: layers whose weights get no gradient (left out of the trainable variables, so the tape never
computes their gradients and nothing all-reduces them) and whose BatchNormalization runs in inference mode."""

import re

import keras

from errors import ConfigError
from loops import private_apis


def _named_path(model, layer):
  """The layer's path with its model's name first (a functional model's layers have bare paths in Keras 3)."""
  return layer.path if layer.path.startswith(model.name + "/") else f"{model.name}/{layer.path}"


def freeze(model, patterns, batchnorm_stats=True):
  """Freezes the layers of `model` (or of each model of a list: a task's) whose path matches one of the regular
  expressions `patterns` (re.search), with every layer inside them. A pattern is searched in the layer's path and
  in it led by its model's name ("discriminator/dense"), so it can pick one model's layers. Call before the
  optimizers are built.

  batchnorm_stats: True = a frozen BatchNormalization runs in inference mode (Keras' layer.trainable=False);
  False = it keeps normalising with batch statistics (moving averages updated), only gamma and beta frozen.

  Returns:
    The paths of the frozen layers that hold weights.

  Raises:
    ConfigError: a pattern that matches no layer (one line listing the layers).
  """
  models = model if isinstance(model, (list, tuple)) else [model]
  named = [(_named_path(m, l), l) for m in models for l in private_apis.all_layers(m, include_self=False) if l.path]
  chosen = []
  for pattern in patterns:
    matched = [l for path, l in named if re.search(pattern, l.path) or re.search(pattern, path)]
    if not matched:
      raise ConfigError(f"train.freeze pattern '{pattern}' matches no layer; layers: "
                        f"{compact(path for path, _ in named)}")
    chosen.extend(matched)
  frozen = {}
  for layer in chosen:
    for inner in private_apis.all_layers(layer):
      if not private_apis.all_layers(inner, include_self=False):  # leaves only: a container's flag would reach its BN
        frozen[id(inner)] = inner
  for layer in frozen.values():
    if isinstance(layer, keras.layers.BatchNormalization) and not batchnorm_stats:
      for variable in layer.trainable_weights:
        variable.trainable = False
    else:
      layer.trainable = False
  return [layer.path for layer in frozen.values() if layer.weights]


def compact(names, limit=12):
  """'a, b, c' with at most `limit` names, then '... (N more)'."""
  names = list(names)
  shown = ", ".join(names[:limit])
  return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")
