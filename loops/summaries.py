"""TensorBoard writing, chief only: one switch between a real writer and a no-op one."""

import tensorflow as tf


class Summaries:

  def __init__(self, logdir, enabled):
    self.enabled = enabled
    self._writer = tf.summary.create_file_writer(logdir) if enabled else tf.summary.create_noop_writer()

  def scalars(self, step, values):
    with self._writer.as_default(step=step):
      for tag, value in values.items():
        tf.summary.scalar(tag, value)

  def text(self, step, tag, markdown):
    with self._writer.as_default(step=step):
      tf.summary.text(tag, markdown)

  def flush(self):
    self._writer.flush()

  def close(self):
    self._writer.close()
