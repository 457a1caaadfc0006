"""scikit-learn's bundled digits as arrays for the example tasks: float images in [0, 1] and class ids.

The same fixed stratified 80/20 split as the built-in `data.name=digits` source."""

import numpy as np
from sklearn import datasets
from sklearn import model_selection


def images_and_labels(split):
  """(float32 images [N, 8, 8, 1] in [0, 1], int64 labels [N]) of split "train" or "eval"."""
  digits = datasets.load_digits()
  images = (digits.images / 16.0).astype(np.float32)[..., None]
  labels = digits.target.astype(np.int64)
  train_x, eval_x, train_y, eval_y = model_selection.train_test_split(
      images, labels, test_size=0.2, random_state=0, stratify=labels)
  return (train_x, train_y) if split == "train" else (eval_x, eval_y)


def classification(split):
  """data.name=examples.tasks.digits:classification — (images, class ids)."""
  return images_and_labels(split)
