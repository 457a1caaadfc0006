"""Datasets: sources (digits, synthetic, tfds, image folders, npz files) and the train/eval input pipelines.

A leaf: imports only errors.py (the ground floor).
"""

from data.pipeline import (eval_dataset, eval_images, output_shape, raw_image_spec, steps_per_epoch,
                           train_dataset)
from data.sources import SOURCES, Source, load

__all__ = ["SOURCES", "Source", "eval_dataset", "eval_images", "load", "output_shape", "raw_image_spec",
           "steps_per_epoch", "train_dataset"]
