"""The worked examples (examples/), each end to end on digits as the command in its docstring runs it."""

import os

import keras
import numpy as np
import pytest

import data
from loops import run
from tests.conftest import load_config, set_keys


def digits(steps, **overrides):
  c = load_config("digits_cnn")
  c.train.epochs, c.train.steps = None, steps
  c.summary.progress_bar = "off"
  return set_keys(c, overrides)


def numpy_ece(probabilities, labels, bins=15):
  confidence, predicted = probabilities.max(axis=1), probabilities.argmax(axis=1)
  which = np.minimum((confidence * bins).astype(int), bins - 1)
  return sum(abs((predicted[which == b] == labels[which == b]).sum() - confidence[which == b].sum())
             for b in range(bins)) / len(labels)


@pytest.mark.e2e
def test_embedding_model_with_the_norm_penalty_and_the_calibration_metric(tmp_path):
  """The metric, recomputed in numpy from the export (which outputs the logits alone), is the one reported."""
  c = digits(400, **{"model.name": "examples.models:cnn_with_embedding", "model.kwargs.embedding_dim": 16,
                     "loss.name": "examples.losses:embedding_norm_penalty",
                     "eval.metrics": ("accuracy", "examples.metrics:expected_calibration_error")})
  summary = run.train_and_evaluate(c, str(tmp_path))
  assert summary["eval/accuracy"] >= 0.9
  model = keras.models.load_model(os.path.join(tmp_path, "export", "model.keras"))
  rows = [(x, y) for images, labels, weights in data.eval_dataset(data.load(c.data), c.data, batch_size=64)
          for x, y, w in zip(images.numpy(), labels.numpy(), weights.numpy()) if w > 0]
  images, labels = np.stack([r[0] for r in rows]), np.array([r[1] for r in rows])
  logits = model.predict(images, verbose=0)
  assert logits.shape == (len(labels), 10)
  assert (logits.argmax(axis=1) == labels).mean() == pytest.approx(summary["eval/accuracy"], abs=1e-6)
  probabilities = keras.ops.convert_to_numpy(keras.ops.softmax(logits))
  assert summary["eval/expected_calibration_error"] == pytest.approx(numpy_ece(probabilities, labels), abs=1e-4)
  assert 0.0 < summary["eval/expected_calibration_error"] < 0.2


@pytest.mark.e2e
def test_the_reconstruction_auxiliary_loss_trains_digits(tmp_path):
  c = digits(400, **{"model.name": "examples.models:cnn_with_embedding", "model.kwargs.reconstruct": True,
                     "loss.name": "examples.losses:reconstruction_auxiliary"})
  assert run.train_and_evaluate(c, str(tmp_path))["eval/accuracy"] >= 0.9


@pytest.mark.e2e
def test_the_target_callback_stops_digits_early_and_records_when(tmp_path):
  c = digits(1100, **{"eval.every_steps": 100, "callbacks": ("examples.callbacks:stop_at_target_accuracy",)})
  summary = run.train_and_evaluate(c, str(tmp_path))
  assert summary["step"] < 1100 and summary["target_reached_at_step"] == summary["step"]
  assert summary["stopped_early"].startswith("eval/accuracy 0.9") and summary["eval/accuracy"] >= 0.95
