"""Datasets: sources (digits, synthetic, tfds, image folders, npz files) and the train/eval input pipelines.

A leaf: imports only errors.py (the ground floor). The names below are imported when first used, so that
`python -m data.prepare` (and main.py) can start TensorFlow quietly first (data/quiet_start.py).
"""

import importlib

_WHERE = {"eval_dataset": "data.pipeline", "eval_images": "data.pipeline", "output_shape": "data.pipeline",
          "raw_image_spec": "data.pipeline", "steps_per_epoch": "data.pipeline", "train_dataset": "data.pipeline",
          "SOURCES": "data.sources", "image_files": "data.sources", "Source": "data.sources", "load": "data.sources"}

__all__ = sorted(_WHERE)


def __getattr__(name):
  if name not in _WHERE:
    raise AttributeError(f"module 'data' has no attribute '{name}'")
  return getattr(importlib.import_module(_WHERE[name]), name)
