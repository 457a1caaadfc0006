"""Offline quickstart: a small CNN on scikit-learn's bundled 8x8 digits (real data, no download).

  python main.py --config=configs/digits_cnn.py --workdir=runs/digits

Expected: eval/accuracy >= 0.95 (typically ~0.98) after 50 epochs (1 100 steps), about 20 s on 2 CPU cores.
Two replicas with the same global batch (same result within float tolerance):
  python main.py --config=configs/digits_cnn.py --workdir=runs/digits2 --config.strategy=mirrored --config.cpu_replicas=2
Argument `:synthetic` swaps in random 8x8 images (smoke runs only).
"""

from configs import base


def get_config(arg=None):
  opts = base.parse_arg(arg, synthetic=False)
  c = base.get_config()
  c.data.name = "synthetic" if opts.synthetic else "digits"
  c.data.synthetic.image_shape = (8, 8, 1)
  c.model.name = "digits_cnn"
  c.optimizer.name = "sgd"
  c.optimizer.learning_rate = 0.05
  c.train.global_batch_size = 64
  c.train.epochs = 50  # 22 steps per epoch at batch 64: 1 100 steps
  c.train.steps_per_loop = 50
  c.eval.every_steps = 550
  c.checkpoint.every_steps = 550
  return c
