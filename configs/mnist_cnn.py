"""The seeds' warm-up: their MNIST CNN on MNIST (tfds).

  python main.py --config=configs/mnist_cnn.py --workdir=runs/mnist

Needs MNIST in tfds' data_dir (downloaded on first use when there is network; otherwise the run stops and
says how to provide it). Expected: eval/accuracy ~0.99 after 5 epochs (2 340 steps), a few minutes on 2 CPU
cores (~3k images/s). Not measured on this project's offline machines: they have no MNIST.
Smoke run without data: `--config=configs/mnist_cnn.py:synthetic`.
"""

from configs import base


def get_config(arg=None):
  opts = base.parse_arg(arg, synthetic=False)
  c = base.get_config()
  c.data.name = "synthetic" if opts.synthetic else "mnist"
  c.data.synthetic.image_shape = (28, 28, 1)
  c.model.name = "mnist_cnn"
  c.optimizer.name = "sgd"
  c.optimizer.learning_rate = 0.05
  c.train.global_batch_size = 128
  c.train.epochs = 5
  c.train.steps_per_loop = 20
  c.eval.every_steps = 1000
  c.checkpoint.every_steps = 1000
  return c
