"""WGAN-GP on digits: the critic updates every step, the generator every 5th (n_critic = 5), with a gradient penalty
taken through a nested GradientTape (step level, Task.update_every).

  python main.py --config=configs/tasks.py:wgan_gp --workdir=runs/wgan_gp
  python main.py --config=configs/tasks.py:wgan_gp --check=replicas   # 5 steps: the 5th updates the generator

Runtime ~9 s on 2 CPU cores (600 steps, 120 of them generator updates: 4 s of training, the rest is TensorFlow's
start). The generator is the model named "model" (exported: noise in, 8x8 images out). eval/mean_gap is the
per-example distance between a generated image's mean ink and a real one's, 0.20 for the untrained generator; it
reaches ≈ 0.04. eval/wasserstein is the critic's estimate of the distance between real and generated digits (its
mean score of real minus generated images: ≈ 0.1 untrained, ≈ 1.1 at the end, as the critic sharpens).

n_critic the way that works on any number of replicas: `update_every = {"model": 5}` and `if ctx.updates("model"):`
around the generator's update (a Python bool: the step is traced once with and once without it, and the framework
picks each step's variant outside the replicas). `tf.cond(step % 5 == 4, generator_update, no_op)` inside the step
would train on one replica and fail to compile on two; it is refused in one line on any.
"""

import math

import keras
import tensorflow as tf

from loops.task import Task

NOISE = 16
N_CRITIC = 5


def uniform(ctx, rows, shape, salt):
  """Uniform [0, 1) draws keyed like ctx.normal (the same for an example however the batch is split): the normal
  CDF of ctx.normal's draws."""
  return 0.5 * (1.0 + tf.math.erf(ctx.normal(rows, shape, salt) / math.sqrt(2.0)))


class DigitsWganGp(Task):
  """Critic loss: score(fake) - score(real) + penalty_weight * (|grad score(mixed)| - 1)^2 per example; generator
  loss: -score(fake)."""

  train_metrics = ("wasserstein", "gradient_penalty")
  update_every = {"model": N_CRITIC}

  def __init__(self, penalty_weight=10.0):
    self.penalty_weight = penalty_weight

  def build_models(self, ctx):
    generator = keras.Sequential([
        keras.Input((NOISE,)), keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="sigmoid"), keras.layers.Reshape((8, 8, 1))], name="generator")
    critic = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(64), keras.layers.LeakyReLU(0.2),
        keras.layers.Dense(1)], name="critic")  # no BatchNorm: the penalty is per example
    return {"model": generator, "critic": critic}

  def serving_spec(self, features_spec):
    return tf.TensorSpec([NOISE], tf.float32)  # the exported generator takes noise

  def train_step(self, batch, models, optimizers, ctx):
    images, _ = batch
    rows = tf.shape(images)[0]
    generator, critic = models["model"], models["critic"]
    fake = tf.cast(generator(ctx.normal(rows, [NOISE], salt=0), training=True), images.dtype)  # mixed_precision
    epsilon = tf.cast(uniform(ctx, rows, [1, 1, 1], salt=1), images.dtype)  # float64 in the check's floor
    mixed = epsilon * images + (1.0 - epsilon) * fake
    with tf.GradientTape() as tape:
      real_score, fake_score = (tf.cast(critic(x, training=True)[:, 0], images.dtype) for x in (images, fake))
      penalty = self._gradient_penalty(critic, mixed)
      critic_loss = ctx.average(fake_score - real_score + self.penalty_weight * penalty)
      scaled = optimizers["critic"].scale_loss(critic_loss)
    variables = critic.trainable_variables
    optimizers["critic"].apply_gradients(zip(tape.gradient(scaled, variables), variables))
    ctx.log("wasserstein", real_score - fake_score)
    ctx.log("gradient_penalty", penalty)
    if ctx.updates("model"):  # steps 4, 9, 14, ...
      self._generator_update(generator, critic, optimizers["model"], ctx, rows)
    return critic_loss

  def _gradient_penalty(self, critic, mixed):
    """(|d score / d mixed| - 1)^2 per example, differentiable (a nested tape inside the critic's)."""
    with tf.GradientTape() as inner:
      inner.watch(mixed)
      score = tf.cast(critic(mixed, training=True), mixed.dtype)
    slopes = tf.norm(tf.reshape(inner.gradient(score, mixed), [tf.shape(mixed)[0], -1]), axis=1)
    return tf.square(slopes - 1.0)

  def _generator_update(self, generator, critic, optimizer, ctx, rows):
    with tf.GradientTape() as tape:
      fake = generator(ctx.normal(rows, [NOISE], salt=2), training=True)
      loss = ctx.average(-tf.cast(critic(fake, training=True)[:, 0], critic.variable_dtype))
      scaled = optimizer.scale_loss(loss)
    variables = generator.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))

  def eval_step(self, batch, models, ctx):
    images, _ = batch
    rows = tf.shape(images)[0]
    generated = tf.cast(models["model"](tf.random.stateless_normal([rows, NOISE], seed=[7, 7]), training=False),
                        images.dtype)
    gap = tf.abs(tf.reduce_mean(generated, [1, 2, 3]) - tf.reduce_mean(images, [1, 2, 3]))
    critic = models["critic"]
    wasserstein = tf.cast(critic(images, training=False)[:, 0] - critic(generated, training=False)[:, 0], images.dtype)
    return {"mean_gap": gap, "wasserstein": wasserstein}
