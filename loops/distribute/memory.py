"""Memory in use by this process: host RSS (current and peak) and, with GPUs, TensorFlow's allocator on the
fullest local GPU (tf.config.experimental.get_memory_info: current and peak); and a train call's peak
(`StepPeak`): TensorFlow's allocator, reset before the call, on the fullest GPU, else on the CPU (one allocator
for all logical CPUs: every replica's tensors, the input pipeline's buffers too)."""

import contextlib
import resource
import sys

import tensorflow as tf

MB = 2.0 ** 20


def host_rss_mb():
  """(current, peak) resident set size of this process in MB: Linux' VmRSS and VmHWM (one read, so the peak is
  never below the current value); elsewhere getrusage's peak for both."""
  try:
    with open("/proc/self/status") as f:
      fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return int(fields["VmRSS"].split()[0]) * 1024 / MB, int(fields["VmHWM"].split()[0]) * 1024 / MB
  except (OSError, KeyError, ValueError):
    peak_units = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * peak_units / MB
    return peak, peak


def gpu_mb():
  """(current, peak) MB of the local GPU that holds the most, or None without GPUs."""
  usage = [tf.config.experimental.get_memory_info(device.name.replace("/device:", ""))
           for device in tf.config.list_logical_devices("GPU")]
  if not usage:
    return None
  fullest = max(usage, key=lambda info: info["peak"])
  return fullest["current"] / MB, fullest["peak"] / MB


def usage_mb():
  """{memory/host_rss_mb, memory/host_peak_rss_mb[, memory/gpu_mb, memory/gpu_peak_mb]}."""
  current, peak = host_rss_mb()
  values = {"memory/host_rss_mb": current, "memory/host_peak_rss_mb": peak}
  gpu = gpu_mb()
  if gpu is not None:
    values.update({"memory/gpu_mb": gpu[0], "memory/gpu_peak_mb": gpu[1]})
  return values


class StepPeak:
  """The peak of TensorFlow's allocator during train calls (`measured()` around each): `values()` gives
  {memory/step_peak_mb: the largest peak of a call, memory/step_added_mb: that peak less what was in use when
  its call began (activations, gradients and temporaries of a step)}; {} where the allocator keeps no statistics."""

  def __init__(self):
    self.devices = [d.name.replace("/device:", "") for d in tf.config.list_logical_devices("GPU")] or ["CPU:0"]
    self.peak = self.added = None

  @contextlib.contextmanager
  def measured(self):
    try:
      before = [tf.config.experimental.get_memory_info(d)["current"] for d in self.devices]
      for device in self.devices:
        tf.config.experimental.reset_memory_stats(device)
    except (ValueError, tf.errors.OpError):  # an allocator without statistics
      yield
      return
    yield
    peaks = [tf.config.experimental.get_memory_info(d)["peak"] for d in self.devices]
    fullest = max(range(len(peaks)), key=peaks.__getitem__)
    self.peak = max(self.peak or 0.0, peaks[fullest] / MB)
    self.added = max(self.added or 0.0, (peaks[fullest] - before[fullest]) / MB)

  def values(self):
    if self.peak is None:
      return {}
    return {"memory/step_peak_mb": self.peak, "memory/step_added_mb": self.added}
