"""Knowledge distillation: a small student learns from a frozen teacher (a finished run's export) and the labels.

  python main.py --config=configs/digits_cnn.py --workdir=runs/digits          # the teacher, ~20 s
  python main.py --config=configs/tasks.py:distillation --workdir=runs/distill \\
      --config.task.kwargs.teacher=runs/digits/export/model.keras

Runtime ~15 s on 2 CPU cores (600 steps); the student (1 370 parameters) reaches
eval/accuracy ≈ 0.90 and agrees with the teacher on ≈ 0.91 of the eval images. The teacher is not trained, has no
optimizer, is not counted in the trained parameters, and is saved with the checkpoints: a resume restores its weights
from them, given the same command (its path included).
"""

import keras
import tensorflow as tf

from loops.task import Task
from loops.task.classification import correct


class Distill(Task):
  """Loss level: alpha x cross-entropy with the labels + (1 - alpha) x T² x KL(teacher_T || student_T)."""

  train_metrics = ("accuracy",)

  def __init__(self, teacher="", temperature=4.0, alpha=0.3):
    if not teacher:
      raise ValueError("task.kwargs.teacher is required: a .keras file, e.g. a finished run's export/model.keras")
    self.teacher_path, self.temperature, self.alpha = teacher, temperature, alpha

  def build_models(self, ctx):
    teacher = ctx.load_model(self.teacher_path)
    teacher.trainable = False
    student = keras.Sequential([
        keras.Input(ctx.features_spec.shape), keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(ctx.num_classes)], name="student")
    return {"model": student, "teacher": teacher}

  def per_example_loss(self, batch, models, ctx):
    images, labels = batch
    student = tf.cast(models["model"](images, training=True), images.dtype)
    teacher = tf.cast(models["teacher"](images, training=False), images.dtype)
    t = self.temperature
    hard = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, student)
    soft = tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(teacher / t), student / t) - \
        tf.nn.softmax_cross_entropy_with_logits(tf.nn.softmax(teacher / t), teacher / t)  # KL, per example
    ctx.log("accuracy", correct(labels, student))
    return self.alpha * hard + (1 - self.alpha) * t * t * soft

  def eval_step(self, batch, models, ctx):
    images, labels = batch
    student = models["model"](images, training=False)
    teacher = models["teacher"](images, training=False)
    agree = tf.cast(tf.equal(tf.argmax(student, -1), tf.argmax(teacher, -1)), tf.float32)
    return {"loss": tf.nn.sparse_softmax_cross_entropy_with_logits(labels, student),
            "accuracy": correct(labels, student), "teacher_agreement": agree}
