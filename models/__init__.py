"""Models by name: `build(name, input_shape, num_classes, **kwargs)` -> a Keras model that outputs logits.

A leaf: imports only loops.errors (the ground floor). To add a model: write a function `(input_shape, num_classes, **kwargs) -> keras.Model`
in a file of this folder and add one line to MODELS.
"""

from loops.errors import unknown_name
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
    raise unknown_name("model", name, MODELS)
  return MODELS[name](tuple(input_shape), int(num_classes), **kwargs)
