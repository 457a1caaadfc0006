"""A task's export: export/saved_model serves its predict_step on its features (loaded with tf.saved_model.load
alone: the names predict_step returns, the values of the model called directly), export/model.tflite the same;
a predict_step that cannot be traced, or that needs ops LiteRT lacks, is one warning line and no such file."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from examples.tasks import segmentation
from loops import run
from tests.conftest import load_config

pytestmark = pytest.mark.e2e  # trains models (pytest.ini)

ROWS = 48
# measured on this machine over the 300 eval images: the SavedModel's probabilities vs the model called eagerly 0.0,
# LiteRT's (XNNPACK's own kernels) 2.4e-7; masks all equal
TOLERANCE = 1e-5


def short(config, steps=20):
  """config trained for `steps` steps, evaluated and exported once at the end, with export/model.tflite."""
  config.train.epochs, config.train.steps, config.train.steps_per_loop = None, steps, 10
  config.eval.every_steps = config.checkpoint.every_steps = steps
  config.summary.progress_bar = "off"
  config.export_tflite = True
  return config


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(summary, eval images, the exported model.keras's probabilities on them) of a short segmentation run."""
  workdir = str(tmp_path_factory.mktemp("segmentation"))
  summary = run.train_and_evaluate(short(load_config("tasks", "segmentation")), workdir)
  images = segmentation.shapes("eval")[0][:ROWS]
  model = keras.models.load_model(summary["export"]["keras"], compile=False)
  return summary, images, tf.nn.softmax(model(images, training=False)).numpy()


def decided(probabilities):
  """Pixels whose top two probabilities differ by more than the tolerance (where argmax cannot flip)."""
  top = np.sort(probabilities, axis=-1)
  return top[..., -1] - top[..., -2] > 2 * TOLERANCE


def test_the_saved_model_serves_predict_steps_names_and_values(exported):
  summary, images, expected = exported
  serve = tf.saved_model.load(summary["export"]["saved_model"]).signatures["serving_default"]
  served = {name: value.numpy() for name, value in serve(features=images).items()}
  assert set(served) == {"mask", "probabilities"}  # predict_step's names, not the model's {"outputs"}
  assert served["probabilities"].dtype == np.float32 and served["probabilities"].shape == (ROWS, 16, 16, 3)
  np.testing.assert_allclose(served["probabilities"], expected, atol=TOLERANCE, rtol=0)
  assert served["mask"].dtype == np.int32 and served["mask"].shape == (ROWS, 16, 16)
  sure = decided(expected)
  assert sure.mean() > 0.99
  np.testing.assert_array_equal(served["mask"][sure], np.argmax(expected, -1)[sure])
  empty = serve(features=images[:0])  # a batch of none: no rows (a convolution on CPU refuses 0 rows)
  assert empty["mask"].shape == (0, 16, 16) and empty["probabilities"].shape == (0, 16, 16, 3)


def test_the_tflite_file_serves_the_same_names_and_values(exported):
  from ai_edge_litert.interpreter import Interpreter
  summary, images, expected = exported
  assert summary["export"]["tflite"] == os.path.join(os.path.dirname(summary["export"]["keras"]), "model.tflite")
  runner = Interpreter(model_path=summary["export"]["tflite"]).get_signature_runner("serving_default")
  assert list(runner.get_input_details()) == ["features"]
  served = runner(features=images)
  assert set(served) == {"mask", "probabilities"}
  np.testing.assert_allclose(served["probabilities"], expected, atol=TOLERANCE, rtol=0)
  sure = decided(expected)
  np.testing.assert_array_equal(served["mask"][sure], np.argmax(expected, -1)[sure])
  one = runner(features=images[3:4])  # the batch is of any size
  np.testing.assert_allclose(one["probabilities"], expected[3:4], atol=TOLERANCE, rtol=0)


def warnings_with(caplog, words):
  return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and words in r.getMessage()]


def test_a_predict_step_that_cannot_be_traced_is_one_line_and_no_saved_model(tmp_path, caplog):
  config = short(load_config("tasks", "regression"))
  config.task.name = "tests.fixtures.contract_tasks:PredictsFromTargets"
  summary = run.train_and_evaluate(config, str(tmp_path))
  said = warnings_with(caplog, "predict_step cannot serve")
  assert len(said) == 1 and "\n" not in said[0], said
  assert "(ValueError: Tried to convert 'y' to a tensor and failed. Error: None values not supported.); no serving " \
      "SavedModel or model.tflite" in said[0], said[0]  # the targets are None in serving
  assert summary["export"] == {"keras": str(tmp_path / "export" / "model.keras"), "saved_model": None,
                               "tflite": None}
  assert sorted(os.listdir(tmp_path / "export")) == ["model.keras"]


def test_ops_litert_lacks_are_one_line_naming_them_and_the_saved_model_is_written(tmp_path, caplog):
  config = short(load_config("tasks", "regression"))
  config.task.name = "tests.fixtures.contract_tasks:PredictsDigitText"
  summary = run.train_and_evaluate(config, str(tmp_path))
  said = warnings_with(caplog, "model.tflite")
  assert len(said) == 1 and "\n" not in said[0], said
  assert said[0].startswith("export: no model.tflite: ops LiteRT lacks: AsString ("), said[0]
  assert summary["export"]["tflite"] is None and summary["export"]["tflite_error"] == "ops LiteRT lacks: AsString"
  assert not os.path.exists(tmp_path / "export" / "model.tflite")
  serve = tf.saved_model.load(summary["export"]["saved_model"]).signatures["serving_default"]
  served = serve(features=np.zeros([2, 8, 8, 1], np.float32))
  assert served["text"].dtype == tf.string and served["text"].shape == (2,)
  np.testing.assert_array_equal(served["text"].numpy(),
                                [b"%.1f" % v for v in served["value"].numpy()])
