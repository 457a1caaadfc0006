"""The seeds' practice task: the MNIST CNN on Quick, Draw! bitmaps (28x28, 345 classes, tfds quickdraw_bitmap).

  python main.py --config=configs/quickdraw_cnn.py --workdir=runs/quickdraw --config.strategy=mirrored

The dataset has one split of ~50 M drawings (~39 GB decoded): the first 20 000 are held out for eval, the rest
stream from disk through a 50 000-example shuffle buffer (data.in_memory=False). Needs quickdraw_bitmap in
tfds' data_dir. Expected: ~0.70 eval/accuracy after 20 000 steps. Not measured here (no data offline).
Smoke run: `--config=configs/quickdraw_cnn.py:synthetic --config.train.steps=2`.
"""

from configs import base


def get_config(arg=None):
  opts = base.parse_arg(arg, synthetic=False)
  c = base.get_config()
  c.data.name = "synthetic" if opts.synthetic else "quickdraw_bitmap"
  c.data.synthetic.image_shape = (28, 28, 1)
  c.data.synthetic.num_classes = 345
  c.data.train_split = "train[20000:]"
  c.data.eval_split = "train[:20000]"
  c.data.in_memory = False
  c.model.name = "mnist_cnn"
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = 1e-3
  c.train.global_batch_size = 256
  c.train.steps = 20_000
  c.train.steps_per_loop = 50
  c.eval.every_steps = 5000
  c.checkpoint.every_steps = 5000
  return c
