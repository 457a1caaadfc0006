"""export_tflite=True: the digits classifier's export/model.tflite, run by LiteRT's own interpreter
(ai_edge_litert), gives the serving SavedModel's probabilities and classes on raw eval images (the eval's resize
and normalisation inside, EMA weights); a converter refusal names the ops LiteRT lacks; the key needs export."""

import os

import numpy as np
import pytest
import tensorflow as tf

from errors import ConfigError
from loops import rules
from loops import run
from loops.modeling import litert
from tests.conftest import load_config

pytestmark = pytest.mark.e2e  # trains a model (pytest.ini)

ROWS = 64
# measured on this machine: LiteRT (XNNPACK) vs the SavedModel, max |difference| of the probabilities over the 360
# eval images 3.6e-7 (two runs alike); classes all equal
TOLERANCE = 1e-5


def digits_config():
  """digits, 20 steps, resized to 12x12 and normalised, moving averages: what the .tflite must carry inside."""
  c = load_config("digits_cnn")
  c.train.epochs, c.train.steps, c.train.steps_per_loop = None, 20, 10
  c.eval.every_steps = c.checkpoint.every_steps = 20
  c.summary.progress_bar = "off"
  c.data.image_size, c.data.mean, c.data.std = 12, (0.3,), (0.4,)
  c.optimizer.ema_decay = 0.9
  c.export_tflite = True
  return c


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """(summary, raw eval images as float32, the SavedModel's answers on them)."""
  import data
  config = digits_config()
  summary = run.train_and_evaluate(config, str(tmp_path_factory.mktemp("digits")))
  raw = np.stack([image for image, _ in data.load(config.data).eval.take(ROWS).as_numpy_iterator()])
  assert raw.dtype == np.uint8 and raw.shape == (ROWS, 8, 8, 1)  # before the 12x12 resize
  serve = tf.saved_model.load(summary["export"]["saved_model"]).signatures["serving_default"]
  images = raw.astype(np.float32)
  return summary, images, {name: value.numpy() for name, value in serve(images=images).items()}


def test_the_summary_names_the_tflite_file_beside_the_others(exported):
  summary = exported[0]
  export_dir = os.path.dirname(summary["export"]["saved_model"])
  assert summary["export"] == {"keras": os.path.join(export_dir, "model.keras"),
                               "saved_model": os.path.join(export_dir, "saved_model"),
                               "tflite": os.path.join(export_dir, "model.tflite")}
  assert os.path.getsize(summary["export"]["tflite"]) > 10_000  # the weights are inside


def test_litert_gives_the_saved_models_probabilities_and_classes(exported):
  from ai_edge_litert.interpreter import Interpreter
  summary, images, expected = exported
  runner = Interpreter(model_path=summary["export"]["tflite"]).get_signature_runner("serving_default")
  inputs = runner.get_input_details()
  assert list(inputs) == ["images"] and inputs["images"]["dtype"] == np.float32
  assert inputs["images"]["shape_signature"].tolist() == [-1, 8, 8, 1]  # any batch
  served = runner(images=images)
  assert served["probabilities"].dtype == np.float32 and served["probabilities"].shape == (ROWS, 10)
  assert served["classes"].dtype == np.int64
  np.testing.assert_allclose(served["probabilities"], expected["probabilities"], atol=TOLERANCE, rtol=0)
  np.testing.assert_array_equal(served["classes"], expected["classes"])
  assert len(set(expected["classes"].tolist())) > 3  # trained: not one class for every image
  one = runner(images=images[5:6])
  np.testing.assert_allclose(one["probabilities"], expected["probabilities"][5:6], atol=TOLERANCE, rtol=0)


def test_a_refusal_names_every_op_litert_lacks(tmp_path):
  import keras
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])

  def fn(features):
    square = tf.reshape(model(features), [-1, 2, 2])
    return {"det": tf.linalg.det(square), "text": tf.strings.as_string(features)}

  path = str(tmp_path / "model.tflite")
  with pytest.raises(litert.Unconvertible) as refused:
    litert.write_tflite([model], fn, [tf.TensorSpec([None, 4], tf.float32)], path)
  assert str(refused.value) == "ops LiteRT lacks: AsString, MatrixDeterminant"
  assert not os.path.exists(path)


def test_the_file_is_written_through_gfile(tmp_path):
  """A ram:// (or gs://) workdir gets its model.tflite too: the SavedModel is converted from a local temporary
  directory, the bytes written with tf.io.gfile."""
  import keras
  from ai_edge_litert.interpreter import Interpreter
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
  path = litert.write_tflite([model], lambda x: {"y": model(x)}, [tf.TensorSpec([None, 4], tf.float32, name="x")],
                             "ram://litert/model.tflite")
  with tf.io.gfile.GFile(path, "rb") as f:
    runner = Interpreter(model_content=f.read()).get_signature_runner()
  x = np.arange(8, dtype=np.float32).reshape(2, 4)
  np.testing.assert_allclose(runner(x=x)["y"], model(x).numpy(), atol=1e-5, rtol=0)


def test_missing_ops_read_the_converters_lists():
  message = ("error: 'tf.Foo' op is neither a custom op nor a flex op\nerror: failed while converting: 'main':\n"
             "TF Select ops: AsString, StringLength\nCustom ops: MyOp\nDetails:\n\ttf.AsString(tensor<?xf32>)")
  assert litert.missing_ops(message) == ["AsString", "Foo", "MyOp", "StringLength"]
  assert litert.refusal("ConverterError: something else\nmore") == "the converter failed: ConverterError: something else"


def test_export_tflite_without_export_is_one_line():
  config = digits_config()
  config.export = False
  with pytest.raises(ConfigError, match=r"^export_tflite=True writes export/model.tflite beside the export, which "
                     r"export=False turns off; set export=True or export_tflite=False$"):
    rules.check(config)


@pytest.mark.e2e
def test_an_export_without_tflite_removes_an_earlier_exports_tflite(tmp_path, caplog):
  """A rerun exports again without export_tflite: the earlier model.tflite would hold older weights beside it."""
  caplog.set_level("INFO")
  config = load_config("digits_cnn")
  config.train.epochs, config.train.steps, config.train.steps_per_loop, config.eval.every_steps = None, 10, 10, 0
  workdir = tmp_path / "w"
  (workdir / "export").mkdir(parents=True)
  (workdir / "export" / "model.tflite").write_bytes(b"an earlier export's")
  summary = run.train_and_evaluate(config, str(workdir))
  assert "tflite" not in summary["export"] and os.path.isdir(summary["export"]["saved_model"])
  assert sorted(os.listdir(workdir / "export")) == ["model.keras", "saved_model"]
  assert f"removed {workdir}/export/model.tflite: an earlier export's, not written this time" in caplog.text
