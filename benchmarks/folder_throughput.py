"""Training throughput on a folder of JPEGs, streamed and in memory, side by side with synthetic data.

  python -m benchmarks.folder_throughput --config=configs/digits_cnn.py --folder=/tmp/jpegs [--make=4000]
      [--size=32] [--windows=3] [--config.KEY=VALUE ...] [--out=results.json]

--make=N first writes N train JPEGs (and N/10 test ones) of size x size x 3 in 10 classes under --folder.
Contenders (the framework's compiled loop, same model weights, batch and steps per call):
  streamed   data.name=image_folder, data.in_memory=False (paths shuffled, JPEGs decoded in the pipeline)
  in_memory  data.name=image_folder, data.in_memory=True (decoded once at load)
  synthetic  data.name=synthetic of the same shape, classes and train size (in memory)
  streamed_shared_pool  streamed with data.pipeline_threads=0 (tf.data's shared pool instead of 1 private thread)
Also the input pipeline alone (pipeline_only:<name>, batches pulled without training) and load times.
Windows are interleaved (a, b, c, d, a, ...); each figure is the median of --windows windows.
"""

import functools
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags
import keras
from ml_collections import config_flags
import tensorflow as tf

from configs import settings
from benchmarks import windows as timed
import data
from loops import command_line
from loops import plan as plan_lib
from loops.distribute import cluster
from loops.distribute import strategy as strategy_lib
from loops.modeling import model as model_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, as for main.py (model, batch, optimizer).")
_FOLDER = flags.DEFINE_string("folder", None, "ROOT of ROOT/{train,test}/<class>/*.jpg.")
_MAKE = flags.DEFINE_integer("make", 0, "Write this many train JPEGs (and a tenth as many test ones) first.")
_SIZE = flags.DEFINE_integer("size", 32, "Side of the generated JPEGs (--make).")
_WINDOWS = flags.DEFINE_integer("windows", 3, "Timed windows per contender (median reported).")
_WINDOW_CALLS = flags.DEFINE_integer("window_calls", 5, "Calls of train.steps_per_loop steps per window.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.mark_flags_as_required(["config", "folder"])


def load_cases(config):
  """{name: (data config, Source)} for the four data cases, and the seconds each folder load took."""
  def data_config(**changes):
    d = config.data.copy_and_resolve_references()
    d.name, d.data_dir, d.in_memory = "image_folder", _FOLDER.value, False
    d.update(changes)
    return d

  cases = {"streamed": data_config(), "in_memory": data_config(in_memory=True),
           "streamed_shared_pool": data_config(pipeline_threads=0)}
  load_seconds = {}
  for name, d in cases.items():
    started = time.perf_counter()
    cases[name] = (d, data.load(d))
    load_seconds[name] = time.perf_counter() - started
  folder = cases["streamed"][1]
  synthetic = data_config(name="synthetic")
  synthetic.synthetic.update(image_shape=folder.image_shape, num_classes=folder.num_classes,
                             train_examples=folder.train_size, eval_examples=folder.eval_size)
  cases["synthetic"] = (synthetic, data.load(synthetic))
  return cases, load_seconds


def main(argv):
  del argv
  config = _CONFIG.value
  if _MAKE.value:
    timed.make_folder(_FOLDER.value, _MAKE.value, _SIZE.value)
  read = settings.read(config)
  strategy_lib.configure_devices(read.run)
  strategy = strategy_lib.build(read.run, read.cluster, cluster.ClusterRole())
  keras.utils.set_random_seed(config.seed)
  cases, load_seconds = load_cases(config)
  folder_config, folder = cases["streamed"]
  plan = plan_lib.derive(config.train, config.optimizer, strategy.num_replicas_in_sync, folder.train_size)
  with strategy.scope():
    input_shape = tuple(data.output_shape(folder, folder_config.image_size))
    reference = model_lib.model_function(config.model.name)(input_shape, int(folder.num_classes),
                                                             **dict(config.model.kwargs))
  batches = plan.steps_per_loop * _WINDOW_CALLS.value
  windows = {}
  for name, (d, source) in cases.items():
    stream = functools.partial(data.train_dataset, source, d, batch_size=plan.global_batch_size,
                               steps_per_epoch=plan.steps_per_epoch, seed=config.seed)
    windows[name] = timed.training_window(config, strategy, plan, reference, stream(), _WINDOW_CALLS.value)
    windows[f"pipeline_only:{name}"] = timed.pipeline_window(stream(), batches)
  seconds = timed.interleaved_seconds(windows, _WINDOWS.value)
  images = batches * plan.global_batch_size
  rates = {name: images / statistics.median(times) for name, times in seconds.items()}
  print(f"{folder.train_size} train images {folder.image_shape}, {config.model.name}, batch "
        f"{plan.global_batch_size}, median of {_WINDOWS.value} windows of {batches} steps")
  for name, rate in rates.items():
    print(f"{name:<32}{rate:>10.0f} images/s  {rate / rates['synthetic']:.3f} x synthetic  "
          f"windows: {', '.join(f'{images / s:.0f}' for s in seconds[name])}")
  print("load seconds: " + ", ".join(f"{name} {s:.2f}" for name, s in load_seconds.items()))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"images_per_sec": rates, "ratio_vs_synthetic": {n: r / rates["synthetic"] for n, r in rates.items()},
                 "window_seconds": seconds, "load_seconds": load_seconds, "steps_per_window": batches,
                 "images": [folder.train_size, folder.eval_size, list(folder.image_shape)],
                 "model": config.model.name, "global_batch_size": plan.global_batch_size,
                 "tensorflow": tf.__version__, "date": time.strftime("%Y-%m-%d")}, f, indent=2)
  return 0


if __name__ == "__main__":
  app.run(main, flags_parser=functools.partial(command_line.parse_flags, _CONFIG))
