"""Models by name: `build(name, input_shape, num_classes, **kwargs)` -> a Keras model that outputs logits.

A leaf: imports no loops/. To add a model: write a function `(input_shape, num_classes, **kwargs) -> keras.Model`
in a file of this folder and add one line to MODELS.
"""

import difflib

from models import cnn, resnet

MODELS = {
    "mnist_cnn": cnn.mnist_cnn,
    "digits_cnn": cnn.digits_cnn,
    "cifar_resnet20": resnet.cifar_resnet20,
    "resnet50v2": resnet.resnet50v2,
    "resnet152v2": resnet.resnet152v2,
}


def build(name, input_shape, num_classes, **kwargs):
  if name not in MODELS:
    close = difflib.get_close_matches(name, list(MODELS), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise LookupError(f"unknown model '{name}'{hint}; valid: {', '.join(MODELS)}")
  return MODELS[name](tuple(input_shape), int(num_classes), **kwargs)
