"""Prediction throughput: mode=predict against Keras' model.predict on one device, same model, data and batch.

  python -m benchmarks.predict [--config=configs/mnist_cnn.py:synthetic] [--examples=20000] [--batch=256]
      [--rounds=3] [--workers] [--out=results.json]

Trains the config 2 steps into a temporary workdir (the weights do not matter), then, round by round with the
order alternating: `framework` = main.py's mode=predict in this process (restore, the distributed step, the
gathered rows written as .npz parts: the manifest's examples/s, its first batch's trace included) and
`keras_predict` = the run's exported model.keras loaded, `model.predict` over the same eval pipeline (the
framework's own eval preprocessing, the same batch), softmax and argmax on the host: examples/s over the call, its
trace included. Their classes must agree. `--workers` adds one 2-worker multi_worker_mirrored prediction
(launch.local): each worker computes half of every global batch; on this 2-core machine that measures the cost
of the gather and the processes, not a speed-up. Prints medians and the paired ratio framework / keras_predict.
"""

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def configured(spec, examples, batch):
  """configs/X.py[:arg]'s config for a 2-step run with `examples` eval examples (synthetic data) in batches of
  `batch`."""
  import importlib
  path, _, arg = spec.partition(":")
  config = importlib.import_module(path[:-3].replace("/", ".")).get_config(arg or None)
  config.data.synthetic.eval_examples = examples
  config.train.global_batch_size = batch
  config.train.epochs, config.train.steps, config.train.steps_per_loop = None, 2, 1
  config.eval.every_steps, config.checkpoint.every_steps = 0, 0
  config.eval.metrics, config.checkpoint.best_metric = (), ""
  return config


def framework(config, workdir):
  from loops import run
  shutil.rmtree(os.path.join(workdir, "predictions"), ignore_errors=True)
  predicting = config.copy_and_resolve_references()
  predicting.mode = "predict"
  manifest = run.train_and_evaluate(predicting, workdir)
  parts = sorted(glob.glob(os.path.join(workdir, "predictions", "*", "part-*.npz")))
  return manifest["examples_per_second"], np.concatenate([np.load(p)["class"] for p in parts])


def keras_predict(config, workdir):
  import keras
  import tensorflow as tf
  import data
  source = data.load(config.data)
  model = keras.saving.load_model(os.path.join(workdir, "export", "model.keras"))
  images = data.eval_dataset(source, config.data, batch_size=config.train.global_batch_size)
  images = images.map(lambda x, *_: x)
  started = time.perf_counter()
  logits = model.predict(images, verbose=0)
  classes = tf.argmax(tf.nn.softmax(logits), axis=-1).numpy()[:source.eval_size]
  return source.eval_size / (time.perf_counter() - started), classes


def two_workers(spec, workdir, overrides):
  shutil.rmtree(os.path.join(workdir, "predictions"), ignore_errors=True)
  command = [sys.executable, "-m", "launch.local", "--workers=2", "--", sys.executable, "main.py",
             f"--config={spec}", f"--workdir={workdir}", "--config.mode=predict",
             "--config.strategy=multi_worker_mirrored", *overrides]
  subprocess.run(command, cwd=REPO, check=True, capture_output=True,
                 env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
  manifest = json.load(open(glob.glob(os.path.join(workdir, "predictions", "*", "manifest.json"))[0]))
  return manifest["examples_per_second"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/mnist_cnn.py:synthetic")
  parser.add_argument("--examples", type=int, default=20_000)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--workers", action="store_true")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  overrides = [f"--config.data.synthetic.eval_examples={args.examples}", f"--config.train.global_batch_size="
               f"{args.batch}", "--config.eval.metrics=()", "--config.checkpoint.best_metric=", "--config.train.steps=2"]
  config = configured(args.config, args.examples, args.batch)
  workdir = tempfile.mkdtemp(prefix="predict-bench-")
  from loops import run
  run.train_and_evaluate(config, workdir)
  rates = {"framework": [], "keras_predict": []}
  for number in range(args.rounds):
    order = ("framework", "keras_predict") if number % 2 == 0 else ("keras_predict", "framework")
    classes = {}
    for name in order:
      rate, classes[name] = (framework if name == "framework" else keras_predict)(config, workdir)
      rates[name].append(rate)
    agree = float(np.mean(classes["framework"] == classes["keras_predict"]))
    assert agree == 1.0, f"the classes differ on {1 - agree:.4%} of the examples"
  paired = [f / k for f, k in zip(rates["framework"], rates["keras_predict"])]
  result = {"config": args.config, "examples": args.examples, "batch": args.batch, "rounds": args.rounds,
            "examples_per_sec": {name: round(statistics.median(values), 1) for name, values in rates.items()},
            "ratio_vs_keras_predict_paired": round(statistics.median(paired), 3),
            "every_round": {name: [round(v, 1) for v in values] for name, values in rates.items()},
            "machine": f"{os.cpu_count()} cores, {platform.machine()}"}
  if args.workers:
    result["examples_per_sec"]["two_workers"] = round(two_workers(args.config, workdir, overrides), 1)
  shutil.rmtree(workdir, ignore_errors=True)
  print(json.dumps(result, indent=1))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
