"""A custom eval metric: expected calibration error (Guo et al. 2017), 15 equal-width confidence bins.

    python main.py --config=configs/digits_cnn.py --workdir=runs/ece \
        --config.eval.metrics="('accuracy', 'examples.metrics:expected_calibration_error')"

Expected (2-core CPU, ~17 s with start-up): eval/expected_calibration_error ~0.014 next to eval/accuracy 0.983, in
TensorBoard, summary.json and the HParams tab. Its state is sums (per-bin counts, confidences, hits), which the
strategy adds over every replica and worker, so the value is the one a single device computes on the same data.
"""

import keras
from keras import ops


class ExpectedCalibrationError(keras.metrics.Metric):
  """sum over bins of |accuracy(bin) - confidence(bin)| * share of examples in the bin; weight 0 rows ignored."""

  def __init__(self, bins=15, name="expected_calibration_error"):
    super().__init__(name=name)
    self.bins = bins
    self.counts = self.add_variable((bins,), initializer="zeros", name="counts")
    self.confidences = self.add_variable((bins,), initializer="zeros", name="confidences")
    self.hits = self.add_variable((bins,), initializer="zeros", name="hits")

  def update_state(self, labels, logits, sample_weight=None):
    probabilities = ops.softmax(ops.cast(logits, "float32"), axis=-1)
    confidence = ops.max(probabilities, axis=-1)
    hit = ops.cast(ops.equal(ops.argmax(probabilities, axis=-1), ops.cast(labels, "int64")), "float32")
    weight = ops.ones_like(confidence) if sample_weight is None else ops.cast(sample_weight, "float32")
    bin_index = ops.minimum(ops.cast(confidence * self.bins, "int32"), self.bins - 1)
    one_hot = ops.one_hot(bin_index, self.bins) * weight[:, None]
    self.counts.assign_add(ops.sum(one_hot, axis=0))
    self.confidences.assign_add(ops.sum(one_hot * confidence[:, None], axis=0))
    self.hits.assign_add(ops.sum(one_hot * hit[:, None], axis=0))

  def result(self):
    total = ops.maximum(ops.sum(self.counts), 1.0)
    return ops.sum(ops.abs(self.hits - self.confidences)) / total

  def reset_state(self):
    for variable in (self.counts, self.confidences, self.hits):
      variable.assign(ops.zeros_like(variable))


def expected_calibration_error():
  return ExpectedCalibrationError()
