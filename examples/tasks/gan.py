"""A GAN on digits: two models, two optimizers, each with its own learning rate (step level).

  python main.py --config=configs/tasks.py:gan --workdir=runs/gan

Runtime ~20 s on 2 CPU cores (600 steps). The generator is the model named "model" (exported: noise in, 8x8
images out). eval/mean_gap is the per-example distance between a generated image's mean and a real one's
ink, ~0.35 for an untrained generator; it reaches ≈ 0.06.
"""

import keras
import tensorflow as tf

from loops.task import Task

NOISE = 16


class DigitsGan(Task):
  """Non-saturating GAN loss; the discriminator learns at d_learning_rate (scaled like optimizer.learning_rate)."""

  train_metrics = ("discriminator_loss", "real_score", "fake_score")

  def __init__(self, d_learning_rate=1e-3):
    self.d_learning_rate = d_learning_rate

  def build_models(self, ctx):
    generator = keras.Sequential([
        keras.Input((NOISE,)), keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="sigmoid"), keras.layers.Reshape((8, 8, 1))], name="generator")
    discriminator = keras.Sequential([
        keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(64, name="features"),
        keras.layers.LeakyReLU(0.2), keras.layers.Dense(1, name="score")], name="discriminator")
    return {"model": generator, "discriminator": discriminator}

  def serving_spec(self, features_spec):
    return tf.TensorSpec([NOISE], tf.float32)  # the exported generator takes noise

  def build_optimizers(self, ctx, models):
    return {"model": ctx.optimizer(), "discriminator": ctx.optimizer(learning_rate=self.d_learning_rate)}

  def train_step(self, batch, models, optimizers, ctx):
    images, _ = batch
    rows = tf.shape(images)[0]
    generator, discriminator = models["model"], models["discriminator"]
    bce = lambda logits, target: tf.nn.sigmoid_cross_entropy_with_logits(
        tf.fill(tf.shape(logits), tf.constant(target, logits.dtype)), logits)
    score = lambda x: tf.cast(discriminator(x, training=True)[:, 0], images.dtype)  # float32 under mixed_precision
    with tf.GradientTape() as tape:
      real = score(images)
      fake = score(generator(ctx.normal(rows, [NOISE], salt=0), training=True))
      d_loss = ctx.average(bce(real, 1.0) + bce(fake, 0.0))
      d_scaled = optimizers["discriminator"].scale_loss(d_loss)  # float16: the loss scale; else the loss itself
    d_vars = discriminator.trainable_variables
    optimizers["discriminator"].apply_gradients(zip(tape.gradient(d_scaled, d_vars), d_vars))
    with tf.GradientTape() as tape:
      fake = score(generator(ctx.normal(rows, [NOISE], salt=1), training=True))
      g_loss = ctx.average(bce(fake, 1.0))
      g_scaled = optimizers["model"].scale_loss(g_loss)
    g_vars = generator.trainable_variables
    optimizers["model"].apply_gradients(zip(tape.gradient(g_scaled, g_vars), g_vars))
    ctx.log("discriminator_loss", d_loss * tf.cast(ctx.num_replicas, tf.float32))
    ctx.log("real_score", tf.sigmoid(real))
    ctx.log("fake_score", tf.sigmoid(fake))
    return g_loss

  def eval_step(self, batch, models, ctx):
    images, _ = batch
    rows = tf.shape(images)[0]
    generated = tf.cast(models["model"](tf.random.stateless_normal([rows, NOISE], seed=[7, 7]), training=False),
                        images.dtype)
    gap = tf.abs(tf.reduce_mean(generated, [1, 2, 3]) - tf.reduce_mean(images, [1, 2, 3]))
    fake = tf.cast(models["discriminator"](generated, training=False)[:, 0], images.dtype)
    return {"mean_gap": gap, "fake_score": tf.sigmoid(fake)}
