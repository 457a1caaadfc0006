"""Models by name: `MODELS[name](input_shape, num_classes, **kwargs)` -> a Keras model.

A leaf: imports only errors.py (the ground floor). A model outputs logits, or a dict with "logits" and any other
named outputs (an embedding, auxiliary logits) that a loss may read. Users name their own model function as
"package.module:function" in `model.name` (loaded by loops/build.py); to ship one here, add a line to MODELS.
"""

from errors import unknown_name
from models import cnn, resnet

MODELS = {
    "mnist_cnn": cnn.mnist_cnn,
    "digits_cnn": cnn.digits_cnn,
    "cifar_resnet20": resnet.cifar_resnet20,
    "resnet50v2": resnet.resnet50v2,
    "resnet152v2": resnet.resnet152v2,
}
IMPORT_PATH = "package.module:function"


def get(name):
  """The registry's model function for `name`."""
  if name not in MODELS:
    raise unknown_name("model", name, list(MODELS) + [IMPORT_PATH])
  return MODELS[name]


def build(name, input_shape, num_classes, **kwargs):
  return get(name)(tuple(input_shape), int(num_classes), **kwargs)
