"""The serving export: workdir/export/saved_model, loaded in a fresh process with TensorFlow and numpy alone, gives
the framework's eval probabilities on raw uint8 images (EMA weights, resize and normalisation inside), on one and
two replicas under a mixed-precision policy."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from loops import run
from tests.conftest import REPO, load_config

BATCH = 64

pytestmark = pytest.mark.e2e  # trains models or starts processes (pytest.ini)

# What a serving client runs: TensorFlow and numpy only, no project code on the path.
CLIENT = """
import json, sys, numpy as np, tensorflow as tf
for path in sys.argv[1:]:
  serve = tf.saved_model.load(path).signatures["serving_default"]
  images = np.load(path + ".images.npy")
  out = serve(images=images)
  np.save(path + ".probabilities.npy", out["probabilities"].numpy())
  np.save(path + ".classes.npy", out["classes"].numpy())
  wrong = {"scaled_to_1": images / 16.0, "above_255": images * 20.0, "8_bit": np.round(images * (255 / 16)),
           "shape": np.zeros([2, 3, 3, 1], np.uint8),
           "rank": images[0], "float_whole": images.astype(np.float32), "empty": images[:0]}
  answers = {}
  for name, value in wrong.items():
    try:
      answers[name] = ["served", serve(images=value)["classes"].numpy().tolist()]
    except Exception as e:
      answers[name] = [type(e).__name__, str(e)]
  json.dump(answers, open(path + ".wrong.json", "w"))
"""


def config_for(strategy, **keys):
  """digits, 10 steps, resized to 12x12 and normalised (the preprocessing the export must carry inside)."""
  c = load_config("digits_cnn")
  c.train.epochs, c.train.steps, c.train.steps_per_loop = None, 10, 5
  c.eval.every_steps = c.checkpoint.every_steps = 10
  c.summary.progress_bar = "off"
  c.data.image_size, c.data.mean, c.data.std = 12, (0.3,), (0.4,)
  c.strategy, c.cpu_replicas = strategy, 2 if strategy == "mirrored" else 0
  for key, value in keys.items():
    section, name = key.split(".") if "." in key else (None, key)
    setattr(c[section] if section else c, name, value)
  return c


RUNS = {  # two runs keep the module fast: the second covers two replicas and a mixed-precision policy at once
    "ema": config_for("one_device", **{"optimizer.ema_decay": 0.9}),
    "mirrored_bfloat16": config_for("mirrored", mixed_precision="bfloat16", **{"optimizer.ema_decay": 0.9}),
}


# bfloat16 keeps ~3 significant digits: on CPUs with native bfloat16 (AVX512_BF16) the served graph and an eager
# model round differently by up to 3e-4 (measured); float32 runs agree to 1e-5.
TOLERANCE = {"ema": 1e-5, "mirrored_bfloat16": 1e-3}


def framework_eval(config, workdir):
  """(raw uint8 eval batch, the model's softmax on the eval-preprocessed batch with the raw weights, with the
  moving averages): the final checkpoint restored into a model built as a run builds it."""
  import tensorflow as tf
  import data
  from loops.modeling import model as model_lib
  from loops.modeling import optimizers
  source = data.load(config.data)
  raw = np.stack([image for image, _ in source.eval.take(BATCH).as_numpy_iterator()])
  preprocessed, _, _ = next(iter(data.eval_dataset(source, config.data, batch_size=BATCH)))
  model = model_lib.build_model(config.model, config.mixed_precision, data.output_shape(source, config.data.image_size),
                                source.num_classes)
  optimizer = optimizers.build(config.optimizer, 0.1)
  optimizer.build(model.trainable_variables)
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=tf.Variable(0, dtype=tf.int64))
  checkpoint.restore(tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))).expect_partial()
  softmax = lambda: tf.nn.softmax(tf.cast(model(preprocessed, training=False), tf.float32)).numpy()
  own = softmax()
  with optimizers.averaged_weights(model, optimizer):
    averaged = softmax()
  return raw, own, averaged


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """{run: (summary, saved_model path, framework eval, served probabilities, served classes)} and what
  `saved_model_cli show` printed for the last export: the runs, then one fresh client process serving every
  export, beside the CLI (both mostly import TensorFlow: side by side they take the time of one)."""
  results = {}
  for name, config in RUNS.items():
    workdir = str(tmp_path_factory.mktemp(name))
    summary = run.train_and_evaluate(config, workdir)
    path = os.path.join(workdir, "export", "saved_model")
    results[name] = (summary, path, framework_eval(config, workdir))
    np.save(path + ".images.npy", results[name][2][0])
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  client = subprocess.Popen([sys.executable, "-c", CLIENT, *(r[1] for r in results.values())], cwd="/", env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "show", "--dir", path,
                        "--tag_set", "serve", "--signature_def", "serving_default"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
  _, stderr = client.communicate(timeout=120)
  assert client.returncode == 0, stderr[-3000:]
  assert cli.returncode == 0, cli.stderr[-2000:]
  served = {name: (summary, path, evaluation, np.load(path + ".probabilities.npy"), np.load(path + ".classes.npy"),
                   json.load(open(path + ".wrong.json")))
            for name, (summary, path, evaluation) in results.items()}
  return served, cli.stdout


def test_the_export_holds_model_keras_and_the_saved_model_and_the_summary_names_both(exported):
  for name, (summary, path, *_) in exported[0].items():
    export_dir = os.path.dirname(path)
    assert summary["export"] == {"keras": os.path.join(export_dir, "model.keras"), "saved_model": path}, name
    assert os.path.isfile(os.path.join(path, "saved_model.pb")), name
    assert os.path.isfile(os.path.join(path, "variables", "variables.index")), name
    assert os.path.isfile(os.path.join(export_dir, "model.keras")), name
    with open(os.path.join(os.path.dirname(export_dir), "summary.json")) as f:
      assert json.load(f)["export"] == summary["export"]


@pytest.mark.parametrize("name", list(RUNS))
def test_served_probabilities_are_the_frameworks_eval_on_raw_images(exported, name):
  _, _, (raw, _, averaged), probabilities, classes, _ = exported[0][name]
  assert raw.dtype == np.uint8 and raw.shape == (BATCH, 8, 8, 1)  # the source's images, before the 12x12 resize
  expected = averaged  # the eval's weights: the moving averages under EMA (the model's own otherwise)
  assert probabilities.dtype == np.float32 and probabilities.shape == (BATCH, 10)
  np.testing.assert_allclose(probabilities, expected, atol=TOLERANCE[name], rtol=0)
  np.testing.assert_array_equal(classes, np.argmax(probabilities, axis=-1))
  assert classes.dtype == np.int64


@pytest.mark.parametrize("name", list(RUNS))
def test_with_ema_the_export_serves_the_averages_not_the_raw_weights(exported, name):
  _, _, (_, own, averaged), probabilities, _, _ = exported[0][name]
  assert np.max(np.abs(own - averaged)) > 1e-3  # the two weight sets give different answers on this batch
  assert np.max(np.abs(probabilities - averaged)) < TOLERANCE[name] < np.max(np.abs(probabilities - own))


@pytest.mark.parametrize("name", list(RUNS))
def test_wrong_input_is_a_short_error_not_a_silent_truncation(exported, name):
  """Images scaled to [0, 1] (once truncated to 0 and 1 as uint8: accuracy 0.185), values above 255, digits
  spread over an 8-bit image's 0..255 (once served, probabilities of 1.0), a wrong shape or rank (once a TypeError
  printing the whole array): a short InvalidArgumentError saying what is valid."""
  _, _, _, _, classes, wrong = exported[0][name]
  assert wrong["float_whole"] == ["served", classes.tolist()]  # float32 holding the raw values: the same answers
  assert wrong["empty"] == ["served", []]  # a batch of no images: no answers (a convolution once refused it)
  for case in ("scaled_to_1", "above_255", "8_bit"):
    kind, message = wrong[case]
    assert kind == "InvalidArgumentError" and len(message) < 600 and "array(" not in message, (case, message)
    assert ("images must hold the raw pixel values the model trained on: whole numbers in 0..16 (not images scaled "
            "to [0, 1])") in message, (case, message)
  for case, shape in (("shape", "[2 3 3 1]"), ("rank", "[8 8 1]")):
    kind, message = wrong[case]
    assert kind == "InvalidArgumentError" and len(message) < 600 and "array(" not in message, (case, message)
    assert f"images must be a batch of shape [N, 8, 8, 1], got shape] {shape}" in message, (case, message)


def test_saved_model_cli_lists_the_serving_signature(exported):
  shown = " ".join(exported[1].split())  # the mirrored bfloat16 run's export
  assert "inputs['images'] tensor_info: dtype: DT_FLOAT shape: unknown_rank" in shown, exported[1]
  assert "outputs['probabilities'] tensor_info: dtype: DT_FLOAT shape: (-1, 10)" in shown, exported[1]
  assert "outputs['classes'] tensor_info: dtype: DT_INT64 shape: (-1)" in shown, exported[1]
