"""benchmarks.throughput's contenders and the ratios between them (no flags, no TensorFlow)."""

import statistics


def paired_ratio(seconds, a, b):
  """Rate of `a` / rate of `b` as the median over rounds of the ratio of their windows in the same round (windows
  run a, b, c, ... in turn, so a slow spell of the machine hits both sides of a round alike)."""
  return statistics.median(tb / ta for ta, tb in zip(seconds[a], seconds[b]))


CONTENDERS = ("framework", "keras_fit", "bare_loop", "synthetic", "host_pipeline", "input_only", "framework_keras_bn",
              "user_task")
# name: (numerator, denominator, paired); reported when both contenders ran.
RATIOS = {
    "ratio_vs_keras_fit": ("framework", "keras_fit", False),
    "ratio_vs_bare_loop": ("framework", "bare_loop", False),
    "ratio_real_vs_synthetic": ("framework", "synthetic", False),
    "ratio_host_pipeline_vs_synthetic": ("host_pipeline", "synthetic", False),
    "input_share_of_step": ("framework", "input_only", False),
    "ratio_real_vs_synthetic_paired": ("framework", "synthetic", True),
    "ratio_vs_keras_fit_paired": ("framework", "keras_fit", True),
    "ratio_keras_bn_vs_keras_fit": ("framework_keras_bn", "keras_fit", False),
    "ratio_fused_vs_keras_bn": ("framework", "framework_keras_bn", False),
    "ratio_user_task_vs_built_in_paired": ("user_task", "framework", True),
}


def ratios(rates, seconds):
  """Every ratio of RATIOS whose two contenders ran, and each lever's rate / the framework's."""
  found = {name: paired_ratio(seconds, a, b) if paired else rates[a] / rates[b]
           for name, (a, b, paired) in RATIOS.items() if a in rates and b in rates}
  found.update({f"ratio_{name}": rates[name] / rates["framework"] for name in rates if name.startswith("lever_")})
  return found
