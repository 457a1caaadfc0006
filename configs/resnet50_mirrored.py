"""The seeds' case study: ResNet50V2 (random init) on CIFAR-10 resized to 128x128, MirroredStrategy over all GPUs.

  python main.py --config=configs/resnet50_mirrored.py --workdir=runs/r50
  python main.py --config=configs/resnet50_mirrored.py --workdir=runs/r50 --config.num_gpus=2

Global batch 256 x replicas and learning rate 0.01 x replicas (SGD, momentum 0.9), as in the seeds' scaling
study; `--config.train.global_batch_size=512` fixes the global batch instead (the lr still scales with replicas).
Needs CIFAR-10 in tfds' data_dir. Expected (seeds, 4 GPUs): ~0.75-0.80 eval/accuracy after 30 epochs; on a
CPU it is ~16x ResNet50V2@32px work, seconds per step: use it on GPUs. Not measured here (no GPU, no CIFAR-10).
Smoke run: `--config=configs/resnet50_mirrored.py:synthetic --config.train.global_batch_size=4 --config.train.steps=2`.
Its BatchNorm normalizes each replica's own rows, as Keras `fit` does: `--check=replicas` FAILs naming it (by
design, not a bug); `--config.model.sync_batchnorm=True` makes N replicas compute what one device does.
"""

from configs import base


def get_config(arg=None):
  opts = base.parse_arg(arg, synthetic=False)
  c = base.get_config()
  c.strategy = "mirrored"
  base.use_cifar10(c, opts.synthetic)
  c.data.synthetic.train_examples = 2048  # enough for one global batch of 256 x 8 replicas
  c.data.synthetic.eval_examples = 64
  c.data.image_size = 128
  c.model.name = "resnet50v2"
  c.optimizer.name = "sgd"
  c.optimizer.learning_rate = 0.01
  c.optimizer.lr_scaling = "linear_replicas"
  c.optimizer.momentum = 0.9
  c.train.per_replica_batch_size = 256
  c.train.epochs = 30
  c.train.steps_per_loop = 10
  c.eval.every_steps = 500
  c.checkpoint.every_steps = 500
  return c
