"""The --dry_run report: what a run would do (strategy, replicas, batches, lr, data, steps, model, packs), printed
and returned; nothing is trained or written. It reports on every section of the settings (configs/settings.py),
read once by loops/run.py, and on the built parts (parts.data_settings: the data section, as the pipelines read it)."""

import math
import os
import posixpath

import tensorflow as tf

from data import mixing
from data import records
from data import resident as resident_lib
from data import tfrecord
from data import user_stream
from loops import build as build_lib
from loops.distribute import execution as execution_lib
from loops.distribute import strategy as strategy_lib
from loops.modeling import fused_batchnorm
from loops.persist import checkpoints as checkpoints_lib
from loops.persist import tracking


def report(settings, config_text, workdir, parts, user_callbacks):
  """Prints and returns {setting: value} for a checked and built run (loops/build.py Parts) of `settings` (the
  run's, configs/settings.py); config_text: the config as printed (str of the bag)."""
  plan, source, role = parts.plan, parts.source, parts.role
  report = {
      "dry_run": True,
      "strategy": settings.run.strategy,
      "process": f"{role.type}:{role.index}" + (" (chief)" if role.is_chief else ""),
      "replicas": plan.replicas,
      "global_batch_size": plan.global_batch_size,
      "per_replica_batch_size": plan.per_replica_batch_size,
      "grad_accum_steps": plan.grad_accum_steps,
      "learning_rate": plan.learning_rate,
      "lr_scaling": settings.optimizer.lr_scaling,
      "schedule": settings.optimizer.schedule,
      "dataset": source.name,
      "train_examples": source.train_size,
      "eval_examples": source.eval_size,
      "input_shape": list(parts.input_shape) if parts.input_shape else str(parts.element_spec[0]),
      "device_resident": _residency_line(parts),
      **({"streams": _streams_line(parts)} if source.train_files is not None else {}),
      **({"input_streams": _input_streams_line(parts)} if source.streams else {}),
      "num_classes": source.num_classes or None,  # None: the data has no classes (a regression's)
      "steps_per_epoch": plan.steps_per_epoch,
      "total_steps": plan.total_steps,
      "steps_per_loop": plan.steps_per_loop,
      "epochs": round(plan.epochs, 3),
      "task": _task_line(settings.task.name, parts),
      "models": {name: f"{m.name}, {m.count_params()} parameters{'' if name in parts.optimizers else ', frozen'}"
                 for name, m in parts.models.items()},
      "optimizers": {name: f"{type(getattr(o, 'inner_optimizer', o)).__name__}, base learning rate "
                           f"{parts.learning_rates[name]:g}" for name, o in parts.optimizers.items()},
      "model": settings.model.name,
      "parameters": parts.main_model.count_params(),
      "fused_batchnorm_layers": fused_batchnorm.fused_layers(parts.main_model),
      **({"gradient_all_reduce": _packs_line(parts, settings.cluster.bytes_per_pack)}
         if strategy_lib.is_multi_worker(parts.strategy) else {}),
      "eval_metrics": parts.eval_tags,
      "early_stopping": settings.early_stopping.metric or "off",
      "best_metric": _best_line(settings.checkpoint),
      "callbacks": [type(c).__name__ for c in user_callbacks],
      "tracking": _tracking_line(settings.tracking, workdir),
      "workdir": _absolute(workdir),
      "checkpoints": posixpath.join(_absolute(workdir), "checkpoints"),
      "resumes_from": (checkpoints_lib.index_paths(posixpath.join(workdir, "checkpoints")) or [None])[0],
  }
  report["trained_parameters"] = build_lib.trained_parameters(parts)
  if parts.task.writes_step or settings.task.name != "classification":
    del report["model"], report["parameters"]  # model.name is the built-in's; the models row says it all
  if settings.init.checkpoint:
    report["init"] = _init_line(settings.init, parts, report["resumes_from"])
  report.update(_data_checks(settings.data))
  print(f"config:\n{config_text}")
  print("dry run (nothing trained or written):")
  for key, value in report.items():
    print(f"  {key}: {value}")
  return report


def _best_line(checkpoint):
  """checkpoint.best_metric (checkpoint.best_mode), or 'off'."""
  return f"{checkpoint.best_metric} ({checkpoint.best_mode})" if checkpoint.best_metric else "off"


def _tracking_line(tracking_settings, workdir):
  """'mlflow=URI experiment=NAME wandb=PROJECT' (launch/sweep.py reads it), or 'off'. The experiment is named
  only when set: a sweep's trials default to the sweep directory's name, not the dry run's scratch folder's."""
  kinds = tracking.configured_in(tracking_settings)
  if not kinds:
    return "off"
  words = [f"{kind}={setting}" for kind, setting in kinds.items()]
  if "mlflow" in kinds:
    words.insert(1, f"(experiment {tracking_settings.experiment or tracking.experiment_of(workdir)})")
  if tracking_settings.experiment:
    words.append(f"experiment={tracking_settings.experiment}")
  return " ".join(words)


def _data_checks(d):
  """What a dry run checks that a run checks only cheaply or later: the tf.data service answering, every byte of
  prepared record files against the manifest's SHA-256."""
  checks = {}
  if d.service:
    from data import service  # as data/pipeline.py: `python -m data.service` must not find itself imported
    answers = service.reachable(d.service)
    checks["data_service"] = (f"{d.service} " + ("answers" if answers else "does not answer now (a run waits "
                              f"data.service_timeout_seconds={d.service_timeout_seconds:g} for it)"))
  manifest = tfrecord.read_manifest(d.data_dir) if d.name == "tfrecord" else None
  if manifest is not None:
    count = tfrecord.verify_checksums(d.data_dir, manifest)
    checks["prepared_files"] = f"{count} files match their SHA-256 and record counts in the manifest"
  return checks


def _task_line(task_name, parts):
  task = parts.task
  level = "step level (its own train_step)" if task.writes_step else "loss level (per_example_loss)"
  return f"{task_name}: {level}; train scalars {['loss', *task.train_metrics]}"


def _init_line(init, parts, resumes_from):
  """What init.checkpoint would load (the same checks as the run: a refusal raises here); init: its settings."""
  if resumes_from:
    return f"ignored: the run resumes from {resumes_from}"
  return checkpoints_lib.Checkpoints.inspect_warm_start(init, parts, parts.twin)


def _residency_line(parts):
  residency = execution_lib.residency(parts)
  if residency.resident:
    data_settings = parts.data_settings
    gathered = resident_lib.row_bytes(parts.source, data_settings.image_size, mixed=mixing.mixes(data_settings))
    block = resident_lib.block_bytes(gathered, parts.plan.per_replica_batch_size, parts.plan.steps_per_loop)
    return (f"yes, {residency.bytes_per_device} bytes per device + {block} bytes for a call's gathered batches "
            f"({residency.reason})")
  return f"no: host pipeline ({residency.reason})"


def _streams_line(parts):
  files, plan, streams = parts.source.train_files, parts.plan, parts.data_settings.streams
  sizes = records.stream_sizes(files, streams)
  used = plan.steps_per_epoch * plan.global_batch_size
  return (f"{len(files.paths)} train files in {streams} streams of {min(sizes)}-{max(sizes)} records, "
          f"{streams // plan.input_pipelines} stream(s) per input pipeline; an epoch uses {used} of {files.size} "
          f"records ({files.size - used} left out, different ones each epoch); shuffle window "
          f"{parts.data_settings.shuffle_window}")


def _input_streams_line(parts):
  """A task's named streams (Task.streams): each one's global batch, examples and epoch; the eval's."""
  source, batch = parts.source, parts.plan.global_batch_size
  each = [f"{s.name} {s.multiple * batch} per step of {s.size} examples ({user_stream.stream_steps(s, batch)} steps "
          f"an epoch)" for s in source.streams]
  return f"{'; '.join(each)}; eval reads '{source.eval_stream}'"


def _packs_line(parts, bytes_per_pack):
  """The gradient packs of a multi-worker all-reduce at cluster.bytes_per_pack (`bytes_per_pack`)."""
  sizes = [math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in parts.main_model.trainable_variables]
  packs = strategy_lib.gradient_packs(sizes, bytes_per_pack)
  return (f"{len(packs)} pack(s) per step, {sum(sizes)} bytes of gradients when every trainable variable has a "
          f"dense one (cluster.bytes_per_pack={bytes_per_pack}; packs: {packs})")


def _absolute(path):
  return path if "://" in path else os.path.abspath(path)
