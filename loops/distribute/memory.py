"""Memory in use by this process: host RSS (current and peak) and, with GPUs, TensorFlow's allocator on the
fullest local GPU (tf.config.experimental.get_memory_info: current and peak)."""

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
