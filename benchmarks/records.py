"""Data beyond memory, side by side in one run: a folder of large JPEGs against the same images prepared as records.

  python -m benchmarks.records --config=configs/cifar_resnet20.py --folder=/tmp/chips [--make=5000] [--size=500]
      [--image_size=128] [--windows=7] [--out=results.json]

--make=N writes N train JPEGs of size x size (two classes, like seed 001's chip photos) and N/10 test ones; the
folder is then prepared (data.prepare) at --image_size as JPEG (quality 95) and raw records beside it, once.
Contenders, each the input pipeline alone with one private thread (data.pipeline_threads=1: images/s per core),
pulling batches of the config's global batch without training:
  folder          data.name=image_folder, data.in_memory=False: every image decoded at full size, then resized
  jpeg_records    the prepared JPEG records, streamed from disk (data.in_memory=False)
  raw_records     the prepared raw records, streamed
  jpeg_service / raw_service  the same through a local tf.data service (one dispatcher, one data worker process)
and training: the framework's compiled loop (the config's model at --image_size) on the JPEG records streamed from
disk against synthetic data of the same shape (real/synthetic). Windows are interleaved (a, b, c, ..., a, ...);
each figure is the median of --windows windows with their min-max. Also counted, not estimated: the bytes of
records each of 2 workers' input pipelines reads over an epoch, as a fraction of the split's bytes.
"""

import collections
import functools
import json
import os
import statistics
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags
import keras
from ml_collections import config_flags
import numpy as np
import tensorflow as tf

from configs import settings
from benchmarks import windows as timed
import data
from data import prepare as prepare_lib
from data import records
from launch import local
from loops import command_line
from loops import plan as plan_lib
from loops.distribute import cluster
from loops.distribute import strategy as strategy_lib
from loops.modeling import model as model_lib

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (model, batch, optimizer).")
_FOLDER = flags.DEFINE_string("folder", None, "ROOT of ROOT/{train,test}/<class>/*.jpg; records go beside it.")
_MAKE = flags.DEFINE_integer("make", 0, "Write this many train JPEGs (and a tenth as many test ones) first.")
_SIZE = flags.DEFINE_integer("size", 500, "Side of the generated JPEGs (--make).")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 128, "Training resolution (and the records').")
_WINDOWS = flags.DEFINE_integer("windows", 7, "Timed windows per contender (median and min-max reported).")
_WINDOW_BATCHES = flags.DEFINE_integer("window_batches", 20, "Batches per input window.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
flags.mark_flags_as_required(["config", "folder"])
TRAIN_CALLS = 2  # calls of train.steps_per_loop steps per training window
DRAIN = 12  # batches pulled untimed at the start of an input window (more than tf.data prefetches here)


def data_config(config, **changes):
  d = config.data.copy_and_resolve_references()
  d.update(dict(name="image_folder", data_dir=_FOLDER.value, in_memory=False, image_size=_IMAGE_SIZE.value,
                pipeline_threads=1, random_flip=False, mean=None, std=None))
  d.update(changes)
  return d


def prepared(config, image_format):
  out = f"{_FOLDER.value.rstrip('/')}-{image_format}"
  if not tf.io.gfile.exists(os.path.join(out, "manifest.json")):
    started = time.perf_counter()
    prepare_lib.prepare(data_config(config, pipeline_threads=0), out, image_format)
    print(f"prepared {image_format} records in {time.perf_counter() - started:.0f} s", flush=True)
  return out


def input_window(d, batch, service=""):
  """window(): pulls DRAIN batches untimed (what the pipeline prefetched while other contenders ran), then times
  --window_batches batches: the pipeline's own rate, not its buffer's."""
  d = d.copy_and_resolve_references()
  d.service = service
  source = data.load(d)
  iterator = iter(data.train_dataset(source, d, batch_size=batch, steps_per_epoch=data.steps_per_epoch(source, d,
                                                                                                       batch), seed=0))

  def window():
    for _ in range(DRAIN):
      next(iterator)
    started = time.perf_counter()
    for _ in range(_WINDOW_BATCHES.value):
      next(iterator)
    return time.perf_counter() - started
  return window, source


def bytes_per_worker(d, batch, epochs=4):
  """Fraction of the split's record bytes each of 2 input pipelines reads per epoch, counted on the records read:
  the count after 1 + `epochs` epochs minus the count after 1 (tf.data reads ahead of the last step taken; the
  difference leaves that out)."""
  source = data.load(d)
  steps = data.steps_per_epoch(source, d, batch)
  counted = collections.Counter()
  current = [0]

  def audit(path, record):
    return tf.py_function(lambda r: counted.update({current[0]: len(r.numpy()) + 16}) or r, [record], tf.string)

  records.AUDIT = audit
  per_epoch = []
  try:
    for index in (0, 1):
      current[0] = index
      iterator = iter(data.train_dataset(source, d, batch_size=batch // 2, steps_per_epoch=steps, seed=0,
                                         num_shards=2, shard_index=index))
      for _ in range(steps):
        next(iterator)
      after_one = counted[index]
      for _ in range(epochs * steps):
        next(iterator)
      per_epoch.append((counted[index] - after_one) / epochs)
  finally:
    records.AUDIT = None
  total = sum(tf.io.gfile.stat(p).length for p in source.train_files.paths)
  return [b / total for b in per_epoch]


def summarise(seconds, images):
  rates = {name: sorted(images / s for s in times) for name, times in seconds.items()}
  return {name: {"median": statistics.median(r), "min": r[0], "max": r[-1]} for name, r in rates.items()}


def main(argv):
  del argv
  config = _CONFIG.value
  if _MAKE.value:
    timed.make_folder(_FOLDER.value, _MAKE.value, _SIZE.value, classes=2)
  outs = {fmt: prepared(config, fmt) for fmt in ("jpeg", "raw")}
  read = settings.read(config)
  strategy_lib.configure_devices(read.run)
  strategy = strategy_lib.build(read.run, read.cluster, cluster.ClusterRole())
  keras.utils.set_random_seed(config.seed)
  batch = config.train.global_batch_size
  cases = {"folder": data_config(config)}
  for fmt, out in outs.items():
    cases[f"{fmt}_records"] = data_config(config, name="tfrecord", data_dir=out)
  address, service = local.start_data_service(1, sys.stdout, threading.Lock())
  try:  # the input alone, in rounds of its own (a training window's idle time would fill every buffer)
    windows = {name: input_window(d, batch)[0] for name, d in cases.items()}
    for fmt in outs:
      windows[f"{fmt}_service"] = input_window(cases[f"{fmt}_records"], batch, service=address)[0]
    seconds = timed.interleaved_seconds(windows, _WINDOWS.value)
  finally:
    for proc in service.values():
      local._stop(proc)
  records_source = data.load(cases["jpeg_records"])
  synthetic = data_config(config, name="synthetic")
  synthetic.synthetic.update(image_shape=records_source.image_shape, num_classes=records_source.num_classes,
                             train_examples=records_source.train_size, eval_examples=records_source.eval_size)
  plan = plan_lib.derive(config.train, config.optimizer, strategy.num_replicas_in_sync, records_source.train_size)
  with strategy.scope():
    reference = model_lib.model_function(config.model.name)(tuple(records_source.image_shape),
                                                             int(records_source.num_classes),
                                                             **dict(config.model.kwargs))
  training = {}
  for name, d in (("train_jpeg_records", cases["jpeg_records"]), ("train_synthetic", synthetic)):
    source = data.load(d)
    dataset = data.train_dataset(source, d, batch_size=batch, steps_per_epoch=data.steps_per_epoch(source, d, batch),
                                 seed=0)
    training[name] = timed.training_window(config, strategy, plan, reference, dataset, TRAIN_CALLS)
  seconds.update(timed.interleaved_seconds(training, _WINDOWS.value))
  input_images = _WINDOW_BATCHES.value * batch
  train_images = plan.steps_per_loop * TRAIN_CALLS * batch
  results = summarise({n: s for n, s in seconds.items() if not n.startswith("train_")}, input_images)
  results.update(summarise({n: s for n, s in seconds.items() if n.startswith("train_")}, train_images))
  ratios = {"jpeg_records_vs_folder": results["jpeg_records"]["median"] / results["folder"]["median"],
            "raw_records_vs_folder": results["raw_records"]["median"] / results["folder"]["median"],
            "real_vs_synthetic": results["train_jpeg_records"]["median"] / results["train_synthetic"]["median"],
            "bytes_read_per_worker_of_2": bytes_per_worker(cases["jpeg_records"], batch)}
  for name, r in results.items():
    print(f"{name:<22}{r['median']:>9.0f} images/s  [{r['min']:.0f}-{r['max']:.0f}]")
  for name, value in ratios.items():
    print(f"{name:<28}{value}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"images_per_sec": results, "ratios": ratios, "window_seconds": seconds, "batch": batch,
                 "image_size": _IMAGE_SIZE.value, "model": config.model.name, "train_images": records_source.train_size,
                 "date": time.strftime("%Y-%m-%d"), "tensorflow": tf.__version__}, f, indent=2)


if __name__ == "__main__":
  app.run(main, flags_parser=functools.partial(command_line.parse_flags, _CONFIG))
