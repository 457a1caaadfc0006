"""A small CIFAR ResNet-20 on CIFAR-10 at its native 32x32: the CPU-sized ResNet.

  python main.py --config=configs/cifar_resnet20.py --workdir=runs/resnet20

Needs CIFAR-10 in tfds' data_dir. Expected: ~0.90 eval/accuracy after 100 epochs (He et al. report 91.3% with
a longer schedule); about 1 h per epoch on 2 CPU cores — a GPU job. Not measured here (no CIFAR-10).
Smoke run: `--config=configs/cifar_resnet20.py:synthetic --config.train.steps=2`.
Its BatchNorm normalizes each replica's own rows, as Keras `fit` does: `--check=replicas` FAILs naming it (by
design, not a bug); `--config.model.sync_batchnorm=True` makes N replicas compute what one device does.
"""

from configs import base


def get_config(arg=None):
  opts = base.parse_arg(arg, synthetic=False)
  c = base.get_config()
  c.strategy = "mirrored"
  base.use_cifar10(c, opts.synthetic)
  c.model.name = "cifar_resnet20"
  c.optimizer.name = "sgd"
  c.optimizer.learning_rate = 0.1
  c.optimizer.lr_scaling = "linear_batch_256"
  c.optimizer.weight_decay = 1e-4
  c.train.global_batch_size = 128
  c.train.epochs = 100
  c.train.steps_per_loop = 10
  c.eval.every_steps = 2000
  c.checkpoint.every_steps = 2000
  return c
