"""The seeds' case study, deeper: ResNet152V2 on CIFAR-10 at 128x128 (see configs/resnet50_mirrored.py).

  python main.py --config=configs/resnet152_mirrored.py --workdir=runs/r152

Same recipe (global batch 256 x replicas, lr 0.01 x replicas); ~2.9x the work of ResNet50V2 per image.
Expected: about ResNet50V2's accuracy (~0.75-0.80 after 30 epochs) at ~2.9x the time per epoch.
Not measured here (no GPU, no CIFAR-10). Smoke run:
`--config=configs/resnet152_mirrored.py:synthetic --config.train.global_batch_size=2 --config.train.steps=1`.
"""

from configs import resnet50_mirrored


def get_config(arg=None):
  c = resnet50_mirrored.get_config(arg)
  c.model.name = "resnet152v2"
  return c
