"""How long a periodic checkpoint save blocks the training loop, blocking vs asynchronous (checkpoint.async_save).

  python -m benchmarks.async_save [--rounds=5] [--model=resnet50v2] [--image_size=224] [--classes=1000] [--dir=DIR]

Builds the model on CPU with the framework's checkpoint (model, SGD-momentum optimizer with its slots, step, run
variables) and saves it through loops/persist/checkpoints.Checkpoints, alternating blocking and asynchronous saves
in each round. Measured per save: `blocked` = the wall time of Checkpoints.save(step), i.e. what the loop waits
for (asynchronous: the copy of every variable into host memory plus the hand-off; blocking: the whole write);
`background` = for asynchronous saves, the time until the write is on disk and indexed (Checkpoints.wait()), taken
outside the blocked time, as a loop whose checkpoint interval is longer than one write would see. The first
blocking save and the first two asynchronous ones (allocating the host copies, then tracing TensorFlow's copy
function: one-time costs) are warm-up, reported apart. Prints medians over the rounds and blocking/async.
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import tensorflow as tf

from loops.persist import checkpoints as checkpoints_lib
import models


def build_checkpoint(model_name, image_size, classes):
  model = models.build(model_name, (image_size, image_size, 3), classes)
  optimizer = tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
  optimizer.build(model.trainable_variables)
  step = tf.Variable(0, dtype=tf.int64, trainable=False)
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
  return checkpoint, step, model.count_params()


def timed(fn):
  started = time.perf_counter()
  fn()
  return time.perf_counter() - started


def measure(checkpoint, step, rounds, directory):
  series = {mode: checkpoints_lib.Checkpoints(os.path.join(directory, mode), checkpoint, step, keep=2,
                                              is_chief=True, async_save=mode == "async")
            for mode in ("blocking", "async")}
  seconds = {"blocking": [], "async": [], "background": []}
  warm_up = {"blocking": [timed(lambda: series["blocking"].save(0))], "async": []}
  for number in (0, 1):  # the first allocates the host copies; the second traces TensorFlow's copy function
    warm_up["async"].append(timed(lambda: series["async"].save(number)))
    series["async"].wait()
  for number in range(2, rounds + 2):
    order = ("blocking", "async") if number % 2 else ("async", "blocking")
    for mode in order:
      step.assign(number)
      seconds[mode].append(timed(lambda: series[mode].save(number)))
      if mode == "async":
        seconds["background"].append(seconds[mode][-1] + timed(series[mode].wait))
  for each in series.values():
    each.close()
  return warm_up, seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--model", default="resnet50v2")
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--classes", type=int, default=1000)
  parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a new temporary directory)")
  args = parser.parse_args()
  with tf.device("/CPU:0"):
    checkpoint, step, params = build_checkpoint(args.model, args.image_size, args.classes)
  directory = args.dir or tempfile.mkdtemp(prefix="async-save-bench-")
  warm_up, seconds = measure(checkpoint, step, args.rounds, directory)
  ms = {mode: 1000 * statistics.median(values) for mode, values in seconds.items()}
  result = {"model": args.model, "parameters": params, "rounds": args.rounds, "directory": directory,
            "blocked_ms_blocking": round(ms["blocking"], 1), "blocked_ms_async": round(ms["async"], 1),
            "ratio_blocking_over_async": round(ms["blocking"] / ms["async"], 2),
            "async_write_ms_in_background": round(ms["background"], 1),
            "warm_up_saves_ms": {mode: [round(1000 * s, 1) for s in values] for mode, values in warm_up.items()},
            "every_save_ms": {mode: [round(1000 * s, 1) for s in values] for mode, values in seconds.items()},
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, TF {tf.__version__}"}
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
