"""The example tasks of examples/tasks/ on data that is here: `--config=configs/tasks.py:<name>`.

  python main.py --config=configs/tasks.py:regression --workdir=runs/regression

Names (no `:<name>`: regression): regression, gan, wgan_gp, sam, contrastive, segmentation, sequence,
distillation, fixmatch (distillation needs a trained digits run: see examples/tasks/distillation.py). Expected (each
example's docstring says more; measured on 2 CPU cores, 9-40 s each): regression eval/mae ~0.56, gan
eval/mean_gap ~0.06, wgan_gp eval/mean_gap ~0.04, sam eval/accuracy ~0.98, contrastive eval/probe_accuracy ~0.90
and eval/knn_accuracy ~0.94, segmentation eval/mean_iou ~0.98, sequence eval/accuracy ~1.0 (sequences of different
lengths in padded batches), distillation eval/accuracy ~0.90, fixmatch eval/accuracy ~0.94 and eval/loss ~0.26
(~15 s; its 100 labels alone, --config.task.kwargs.unlabeled_weight=0.0: ~0.93 and ~0.43).
"""

from configs import base

EXAMPLES = {
    # name: (task class, data function, best metric, best mode, steps)
    "regression": ("examples.tasks.regression:DigitValue", "examples.tasks.regression:digit_values",
                   "eval/mae", "min", 1000),
    "gan": ("examples.tasks.gan:DigitsGan", "examples.tasks.digits:batches", "eval/mean_gap", "min", 600),
    "wgan_gp": ("examples.tasks.wgan_gp:DigitsWganGp", "examples.tasks.digits:batches", "eval/mean_gap", "min", 600),
    "sam": ("examples.tasks.sam:SharpnessAware", "digits", "eval/accuracy", "max", 600),
    "contrastive": ("examples.tasks.contrastive:NtXent", "examples.tasks.digits:batches",
                    "eval/probe_accuracy", "max", 600),
    "segmentation": ("examples.tasks.segmentation:Shapes", "examples.tasks.segmentation:shapes",
                     "eval/mean_iou", "max", 400),
    "distillation": ("examples.tasks.distillation:Distill", "digits", "eval/accuracy", "max", 600),
    "sequence": ("examples.tasks.sequence:ContainsMarker", "examples.tasks.sequence:padded_batches",
                 "eval/accuracy", "max", 300),
    "fixmatch": ("examples.tasks.fixmatch:FixMatch", "examples.tasks.fixmatch:streams", "eval/accuracy", "max", 600),
}


def get_config(arg="regression"):
  name = arg or "regression"
  if name not in EXAMPLES:
    raise ValueError(f"configs/tasks.py:<name> takes one of {', '.join(EXAMPLES)}, got {name!r}")
  task, data_name, best, mode, steps = EXAMPLES[name]
  c = base.get_config()
  c.task.name = task
  c.data.name = data_name
  c.model.name = "digits_cnn"
  c.train.global_batch_size = 32 if name == "fixmatch" else 64  # fixmatch: 32 labeled + 4 x 32 unlabeled
  c.train.steps = steps
  c.train.steps_per_loop = 50
  c.optimizer.name = "adam"
  c.optimizer.learning_rate = {"regression": 3e-3, "sequence": 1e-2}.get(name, 1e-3)
  c.optimizer.lr_scaling = "none"
  # halfway and at the end, also when --config.train.steps changes (references resolve at use)
  c.eval.every_steps = c.train.get_ref("steps") // 2
  c.checkpoint.every_steps = c.train.get_ref("steps") // 2  # a checkpoint per eval: the sidecar evaluator sees each
  c.eval.metrics = ()
  c.checkpoint.best_metric = best
  c.checkpoint.best_mode = mode
  return c
