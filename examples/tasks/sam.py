"""Sharpness-Aware Minimization (Foret et al. 2021): two gradient computations per update (step level).

  python main.py --config=configs/tasks.py:sam --workdir=runs/sam

Runtime ~15 s on 2 CPU cores (600 steps); reaches eval/accuracy ≈ 0.98 on digits.

The perturbation ε = ρ g / ‖g‖ must use the GLOBAL gradient g: each replica's gradient of its loss share is only
part of it, so the shares are summed over replicas (ctx.sum_over_replicas) before the norm. With the replica's
own gradient, 2 replicas step elsewhere than 1 (`main.py --check=replicas` reports it).
"""

import tensorflow as tf

from loops.task import Task
from loops.task.classification import correct, forward
from loops.modeling import losses


class SharpnessAware(Task):
  """Classification with SAM on the configured model and optimizer."""

  train_metrics = ("accuracy",)

  def __init__(self, rho=0.05):
    self.rho = rho

  def _loss(self, batch, model, ctx):
    images, labels = batch
    logits, _ = forward(model, images, training=True)
    per_example = losses.sparse_categorical_crossentropy(labels, logits)
    return ctx.average(per_example), logits

  def train_step(self, batch, models, optimizers, ctx):
    model, variables = models["model"], models["model"].trainable_variables
    optimizer = optimizers["model"]
    with tf.GradientTape() as tape:
      loss, logits = self._loss(batch, model, ctx)
      scaled = optimizer.scale_loss(loss)  # float16: times the loss scale (cancels in the direction); else the loss
    gradients = ctx.sum_over_replicas(tape.gradient(scaled, variables))  # the global gradient, not this replica's
    scale = self.rho / (tf.linalg.global_norm(gradients) + 1e-12)
    steps = [g * scale for g in gradients]
    for variable, step in zip(variables, steps):
      variable.assign_add(step)
    with tf.GradientTape() as tape:
      sharp_loss, _ = self._loss(batch, model, ctx)
      sharp_scaled = optimizer.scale_loss(sharp_loss)
    sharp_gradients = tape.gradient(sharp_scaled, variables)
    for variable, step in zip(variables, steps):
      variable.assign_sub(step)
    optimizer.apply_gradients(zip(sharp_gradients, variables))  # sums the replicas' shares itself; unscales
    ctx.log("accuracy", correct(batch[1], logits))
    return loss

  def eval_step(self, batch, models, ctx):
    images, labels = batch
    logits, _ = forward(models["model"], images, training=False)
    return {"loss": losses.sparse_categorical_crossentropy(labels, logits), "accuracy": correct(labels, logits)}
