"""Throughput, side by side in one process: the framework's loop vs Keras fit vs a bare loop vs on-device data.

  python -m benchmarks.throughput --config=configs/digits_cnn.py [--config.key=value ...] [--out=results.json]
      [--windows=N] [--window_calls=N] [--contenders=framework,synthetic,...] [--levers]

Same model, data, strategy, global batch and steps per call for all (built in benchmarks/contenders.py):
  framework  the framework's compiled loop (loops.distribute.steps) over the real input pipeline (data.train_dataset)
  keras_fit  model.fit with steps_per_execution = train.steps_per_loop on the same pipeline
  bare_loop  the TF custom-training tutorial: one strategy.run + strategy.reduce step per tf.function call
  synthetic  the framework's loop on one preprocessed batch held on the devices (no input work): the upper bound
  host_pipeline  the framework's loop over the tf.data pipeline, when "framework" is device-resident
  input_only  the device-resident input alone (the same loop and batches, a step that only reads its batch):
             input_share_of_step = its time per step / framework's, the input's cost without a difference of
             two noisy rates
  framework_keras_bn  "framework" with Keras' own BatchNormalization ops (model.fused_batchnorm=False), when the
             model has BatchNorm layers the framework fuses: what the loop alone gains
  user_task  "framework" with examples.tasks.digits:Classifier, the built-in classification (same loss, same
             train/accuracy) written as a user's loss-level task: what the task contract costs a user's step
The framework contenders run the model as a run does (loops.modeling.model.configure_batchnorm: fused BatchNorm by
default); keras_fit and bare_loop run it as Keras does.
Warm-up calls (tracing) are not timed; every figure is the median of --windows timed windows, interleaved
in rounds (a, b, c, then b, c, a, ...: each takes every place in turn) so machine noise hits all alike; the
*_paired ratios are medians of the per-round ratios.
Also measures the machine's float32 matmul peak and the model's training FLOPs per image (TF profiler) to report
the fraction of peak reached.
"""

import functools
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags
from ml_collections import config_flags

from benchmarks.ratios import CONTENDERS, ratios
from loops import command_line

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file, as for main.py.")
_OUT = flags.DEFINE_string("out", None, "Write the results as JSON here.")
_WINDOWS = flags.DEFINE_integer("windows", 3, "Timed windows per contender (median reported).")
_WINDOW_CALLS = flags.DEFINE_integer("window_calls", 5, "Calls of train.steps_per_loop steps per window.")
_LEVERS = flags.DEFINE_bool("levers", False, "Also time variants of the framework's loop (see benchmarks/README.md).")
_CONTENDERS = flags.DEFINE_list("contenders", None, "Time only these contenders (e.g. framework,synthetic: more "
                                "windows per pair in the same time); default: all. Ratios need both sides.")
flags.mark_flags_as_required(["config"])


def time_in_rounds(runners, rounds):
  """name -> seconds of each window. Warm-up first (tracing, pipeline start-up: not timed); then `rounds` rounds in
  which every contender runs one window, each taking every place in a round in turn (no place bias)."""
  for window in runners.values():
    window()
  seconds = {name: [] for name in runners}
  names = list(runners)
  for round_index in range(rounds):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      started = time.perf_counter()
      own_timing = runners[name]()
      seconds[name].append(own_timing if own_timing is not None else time.perf_counter() - started)
  return seconds


def main(argv):
  del argv
  config = _CONFIG.value
  if _CONTENDERS.value and ("framework" not in _CONTENDERS.value or set(_CONTENDERS.value) - set(CONTENDERS)):
    raise SystemExit(f"--contenders must include framework and name only {','.join(CONTENDERS)}; "
                     f"got {','.join(_CONTENDERS.value)}")
  from benchmarks import contenders as contenders_lib  # TensorFlow: only once the flags are known good

  bench = contenders_lib.Contenders(config, _WINDOW_CALLS.value)
  runners = bench.runners(levers=_LEVERS.value, only=_CONTENDERS.value)
  seconds = time_in_rounds(runners, _WINDOWS.value)
  images = bench.steps_per_window * bench.plan.global_batch_size
  rates = {name: images / statistics.median(times) for name, times in seconds.items()}
  peak = contenders_lib.gemm_peak_gflops()
  per_image = contenders_lib.training_gflops_per_image(bench.reference, bench.loss_fn, bench.input_shape)
  results = {
      "images_per_sec": rates,
      **ratios(rates, seconds),
      "device_resident": bench.residency.resident,
      "device_resident_reason": bench.residency.reason,
      "fused_batchnorm_layers": bench.fused_layers,
      "gemm_peak_gflops": peak,
      "model_gflops_per_image": per_image,
      "fraction_of_peak": rates["framework"] * per_image / peak,
      "window_seconds": seconds,
      "steps_per_window": bench.steps_per_window,
      "config": json.loads(config.to_json_best_effort()),
      "replicas": bench.plan.replicas,
      "global_batch_size": bench.plan.global_batch_size,
      "steps_per_loop": bench.steps_per_call,
      "versions": {"tensorflow": contenders_lib.tf.__version__, "keras": contenders_lib.keras.__version__,
                   "python": platform.python_version(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                   "cpu_half_precision_units": half_precision_units()},
      "date": time.strftime("%Y-%m-%d"),
  }
  report(results, config.model.name)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(results, f, indent=2)
  return 0


def half_precision_units():
  """The CPU's bfloat16/float16 units: which CPU a mixed-precision figure came from (loops/modeling/model.py says
  which of them make a precision fast)."""
  from loops.modeling import model as model_lib
  return sorted({"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"} & model_lib.cpu_flags())


def report(results, model_name):
  rates = results["images_per_sec"]
  print(f"{'contender':<20}{'images/s':>12}   (median of {_WINDOWS.value} windows of {results['steps_per_window']} "
        f"steps, batch {results['global_batch_size']}, {results['replicas']} replica(s), {model_name})")
  for name, rate in rates.items():
    print(f"{name:<20}{rate:>12.0f}")
  print(f"train input: {'device-resident' if results['device_resident'] else 'host pipeline'} "
        f"({results['device_resident_reason']})")
  shown = [key for key in results if key.startswith(("ratio_", "input_share")) and not key.startswith("ratio_lever_")]
  for key in [*shown, "gemm_peak_gflops", "model_gflops_per_image", "fraction_of_peak"]:
    print(f"{key:<36}{results[key]:.4g}")


if __name__ == "__main__":
  sys.exit(app.run(main, flags_parser=functools.partial(command_line.parse_flags, _CONFIG)))
