"""The --dry_run report: what a run would do (strategy, replicas, batches, lr, data, steps, model, packs), printed
and returned; nothing is trained or written."""

import math
import os
import posixpath

import tensorflow as tf

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


def report(config, workdir, parts, user_callbacks):
  """Prints and returns {setting: value} for a checked and built run (loops/build.py Parts)."""
  plan, source, role = parts.plan, parts.source, parts.role
  report = {
      "dry_run": True,
      "strategy": config.strategy,
      "process": f"{role.type}:{role.index}" + (" (chief)" if role.is_chief else ""),
      "replicas": plan.replicas,
      "global_batch_size": plan.global_batch_size,
      "per_replica_batch_size": plan.per_replica_batch_size,
      "grad_accum_steps": plan.grad_accum_steps,
      "learning_rate": plan.learning_rate,
      "lr_scaling": config.optimizer.lr_scaling,
      "schedule": config.optimizer.schedule,
      "dataset": source.name,
      "train_examples": source.train_size,
      "eval_examples": source.eval_size,
      "input_shape": list(parts.input_shape) if parts.input_shape else str(parts.element_spec[0]),
      "device_resident": _residency_line(parts, config),
      **({"streams": _streams_line(parts, config)} if source.train_files is not None else {}),
      **({"input_streams": _input_streams_line(parts)} if source.streams else {}),
      "num_classes": source.num_classes,
      "steps_per_epoch": plan.steps_per_epoch,
      "total_steps": plan.total_steps,
      "steps_per_loop": plan.steps_per_loop,
      "epochs": round(plan.epochs, 3),
      "task": _task_line(config, parts),
      "models": {name: f"{m.name}, {m.count_params()} parameters{'' if name in parts.optimizers else ', frozen'}"
                 for name, m in parts.models.items()},
      "optimizers": {name: f"{type(getattr(o, 'inner_optimizer', o)).__name__}, base learning rate "
                           f"{parts.learning_rates[name]:g}" for name, o in parts.optimizers.items()},
      "model": config.model.name,
      "parameters": parts.main_model.count_params(),
      "fused_batchnorm_layers": fused_batchnorm.fused_layers(parts.main_model),
      **({"gradient_all_reduce": _packs_line(parts, config)} if strategy_lib.is_multi_worker(parts.strategy) else {}),
      "eval_metrics": parts.eval_tags,
      "early_stopping": config.early_stopping.metric or "off",
      "best_metric": f"{config.checkpoint.best_metric} ({config.checkpoint.best_mode})" if config.checkpoint.best_metric
                     else "off",
      "callbacks": [type(c).__name__ for c in user_callbacks],
      "tracking": _tracking_line(config, workdir),
      "workdir": _absolute(workdir),
      "checkpoints": posixpath.join(_absolute(workdir), "checkpoints"),
      "resumes_from": (checkpoints_lib.index_paths(posixpath.join(workdir, "checkpoints")) or [None])[0],
  }
  report["trained_parameters"] = build_lib.trained_parameters(parts)
  if parts.task.writes_step or config.task.name != "classification":
    del report["model"], report["parameters"]  # model.name is the built-in's; the models row says it all
  if config.init.checkpoint:
    report["init"] = _init_line(config, parts, report["resumes_from"])
  report.update(_data_checks(config.data))
  print(f"config:\n{config}")
  print("dry run (nothing trained or written):")
  for key, value in report.items():
    print(f"  {key}: {value}")
  return report


def _tracking_line(config, workdir):
  """'mlflow=URI experiment=NAME wandb=PROJECT' (launch/sweep.py reads it), or 'off'. The experiment is named
  only when set: a sweep's trials default to the sweep directory's name, not the dry run's scratch folder's."""
  kinds = tracking.configured_in(config.tracking)
  if not kinds:
    return "off"
  words = [f"{kind}={setting}" for kind, setting in kinds.items()]
  if "mlflow" in kinds:
    words.insert(1, f"(experiment {config.tracking.experiment or tracking.experiment_of(workdir)})")
  if config.tracking.experiment:
    words.append(f"experiment={config.tracking.experiment}")
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


def _task_line(config, parts):
  task = parts.task
  level = "step level (its own train_step)" if task.writes_step else "loss level (per_example_loss)"
  return f"{config.task.name}: {level}; train scalars {['loss', *task.train_metrics]}"


def _init_line(config, parts, resumes_from):
  """What init.checkpoint would load (the same checks as the run: a refusal raises here)."""
  if resumes_from:
    return f"ignored: the run resumes from {resumes_from}"
  return checkpoints_lib.Checkpoints.inspect_warm_start(config.init, parts, build_lib.twin(config, parts))


def _residency_line(parts, config):
  residency = execution_lib.residency(parts, config.data)
  if residency.resident:
    block = resident_lib.block_bytes(parts.source, config.data, parts.plan.per_replica_batch_size,
                                     parts.plan.steps_per_loop)
    return (f"yes, {residency.bytes_per_device} bytes per device + {block} bytes for a call's gathered batches "
            f"({residency.reason})")
  return f"no: host pipeline ({residency.reason})"


def _streams_line(parts, config):
  files, plan, streams = parts.source.train_files, parts.plan, config.data.streams
  sizes = records.stream_sizes(files, streams)
  used = plan.steps_per_epoch * plan.global_batch_size
  return (f"{len(files.paths)} train files in {streams} streams of {min(sizes)}-{max(sizes)} records, "
          f"{streams // plan.input_pipelines} stream(s) per input pipeline; an epoch uses {used} of {files.size} "
          f"records ({files.size - used} left out, different ones each epoch); shuffle window "
          f"{config.data.shuffle_window}")


def _input_streams_line(parts):
  """A task's named streams (Task.streams): each one's global batch, examples and epoch; the eval's."""
  source, batch = parts.source, parts.plan.global_batch_size
  each = [f"{s.name} {s.multiple * batch} per step of {s.size} examples ({user_stream.stream_steps(s, batch)} steps "
          f"an epoch)" for s in source.streams]
  return f"{'; '.join(each)}; eval reads '{source.eval_stream}'"


def _packs_line(parts, config):
  sizes = [math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in parts.main_model.trainable_variables]
  packs = strategy_lib.gradient_packs(sizes, config.cluster.bytes_per_pack)
  return (f"{len(packs)} pack(s) per step, {sum(sizes)} bytes of gradients when every trainable variable has a "
          f"dense one (cluster.bytes_per_pack={config.cluster.bytes_per_pack}; packs: {packs})")


def _absolute(path):
  return path if "://" in path else os.path.abspath(path)
