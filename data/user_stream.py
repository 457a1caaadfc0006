"""A user's input function as a source: `data.name=package.module:function` whose function takes a `context`.

  def function(split, *, batch_size, context, seed, epoch) -> tf.data.Dataset of (features, targets) batches

is called once per input pipeline and epoch, inside tf.data (seed and epoch are scalar int64 tensors: key your
shuffles on them with stateless ops), with `context` the pipeline's tf.distribute.InputContext and `batch_size`
the batch of ONE replica (TF's `context.get_per_replica_batch_size(global_batch)`; a pipeline feeding several
replicas yields one batch per replica, in turn). The train split: this pipeline's batches of one epoch, as

  examples in an order keyed on (seed, epoch) -> .shard(context.num_input_pipelines, context.input_pipeline_id)
  -> .batch(batch_size, drop_remainder=True)

so the pipelines' batches of a step are disjoint rows of one global batch, the same rows whatever the replica
or worker count; the framework takes an epoch's whole global batches, skips what a resumed run has done and
goes on with epoch + 1 — so when the function is a pure function of its arguments, resume is exact. The eval
split is read whole (context: one pipeline) and must keep every example; the framework pads and shards it as it
does any eval split. Both splits need a known length (`ds.apply(tf.data.experimental.assert_cardinality(n))`
where tf.data cannot tell).
"""

import inspect
import re

import tensorflow as tf

from data.source import Source
from errors import ConfigError, InputPipelineError

_MAX_EPOCHS = 1 << 40
_EVAL_READ = 128  # the eval split is read in batches of this many (then padded and sharded as examples)
_WHOLE = tf.distribute.InputContext()  # one pipeline, one replica


def is_input_function(fn):
  try:
    return "context" in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def load(name, fn):
  """The Source of an input function: its splits' lengths and element specs, from three calls (train and eval
  one example per batch, eval as it is read)."""
  train = _call(name, fn, "train", batch_size=1, context=_WHOLE)
  ones = _call(name, fn, "eval", batch_size=1, context=_WHOLE)
  sizes = {"train": _length(name, "train", train), "eval": _length(name, "eval", ones)}
  if has_unknown_dims(ones.element_spec):  # sequences padded per batch: read one by one, each at its own length
    return _source(name, fn, sizes, train.unbatch(), ones.unbatch())
  evaluation = _call(name, fn, "eval", batch_size=_EVAL_READ, context=_WHOLE)
  read = int(evaluation.cardinality())
  if read < 0:
    raise ConfigError(f"data.name='{name}': the length of the 'eval' dataset at batch_size={_EVAL_READ} is unknown "
                      f"to tf.data; declare it with ds.apply(tf.data.experimental.assert_cardinality(number_of_"
                      f"batches))")
  if read * _EVAL_READ < sizes["eval"]:
    raise ConfigError(f"data.name='{name}': the 'eval' dataset drops its last partial batch (batch(..., "
                      f"drop_remainder=True)); the eval must see every example: batch it without dropping")
  return _source(name, fn, sizes, train.unbatch(), evaluation.unbatch())


def has_unknown_dims(element_spec, batched=True):
  """True when some feature or target of the batches (batched=False: of the examples) has a dimension of unknown
  size besides the batch's (a sequence padded to the longest of its batch: padded_batch, bucket_by_sequence_length)."""
  specs = [s for s in tf.nest.flatten(element_spec) if isinstance(s, tf.TensorSpec)]
  return any(s.shape.rank is None or None in s.shape.as_list()[int(batched):] for s in specs)


def _source(name, fn, sizes, train, evaluation):
  if train.element_spec != evaluation.element_spec:
    raise ConfigError(f"data.name='{name}': the eval split's batches {evaluation.element_spec} differ from the "
                      f"train split's {train.element_spec}")
  return Source(name=name, train=train, eval=evaluation, train_size=sizes["train"], eval_size=sizes["eval"],
                num_classes=0, image_shape=None, max_value=1.0, input_fn=fn)


def train_batches(source, *, batch_size, steps_per_epoch, seed, start_step, num_shards, shard_index,
                  local_replicas, decorrelate=False):
  """This pipeline's batches of `batch_size` from global step `start_step`, one per local replica and step
  (decorrelate: each epoch's seed mixed with the clock, for asynchronous parameter-server workers)."""
  from data.pipeline import decorrelated  # data.pipeline imports this module
  context = tf.distribute.InputContext(num_shards, shard_index, num_shards * local_replicas)
  per_epoch, start = steps_per_epoch * local_replicas, start_step * local_replicas
  start_epoch, skip = divmod(int(start), int(per_epoch))

  def one_epoch(epoch):
    epoch_seed = decorrelated(seed) if decorrelate else seed
    ds = _call(source.name, source.input_fn, "train", batch_size=batch_size, context=context, seed=epoch_seed,
               epoch=epoch).take(per_epoch)
    ds = ds.apply(tf.data.experimental.assert_cardinality(per_epoch))  # a shorter epoch: short_epoch's one line
    return ds.skip(tf.where(epoch == start_epoch, tf.constant(skip, tf.int64), 0))

  ds = tf.data.Dataset.range(start_epoch, _MAX_EPOCHS).flat_map(one_epoch)
  return ds.map(lambda features, targets: _whole_batch(source.name, batch_size, features, targets))


_SHORT_EPOCH = re.compile(r"Input dataset was expected to contain (\d+) elements but contained only (\d+) elements")


def short_epoch(error, name, step, steps_per_epoch):
  """ConfigError for an input function's epoch that ended early (tf.data's assert_cardinality in train_batches), or
  None. Without it an empty epoch was skipped for the next, forever: the run hung."""
  found = _SHORT_EPOCH.search(str(error))
  if not isinstance(error, tf.errors.FailedPreconditionError) or not found:
    return None
  expected, got = found.groups()
  return ConfigError(f"data.name='{name}': an epoch of the input function ended after {got} of its {expected} "
                     f"batches (in the train call from step {step}, epoch {step // steps_per_epoch}): every epoch "
                     "must yield as many whole batches as the first, whose length the plan read at load")


_PYTHON_ERROR = re.compile(r"^(\w+(?:Error|Exception)): (.+)$", re.M)
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_NOT_WHOLE = "a train batch is not batch_size long"


def input_failure(error, name, step):
  """One line for a train call that failed reading the input function's batches after `step` steps: a Python
  exception in its map functions or a tf.debugging check of its own (InputPipelineError: the steps before it are
  complete), a batch of another size (ConfigError); else None."""
  text = str(error)
  if not isinstance(error, tf.errors.OpError) or "IteratorGetNext" not in text:
    return None
  if _NOT_WHOLE in text:  # not an InputPipelineError: steps may have trained on short batches; nothing is saved
    return ConfigError(f"data.name='{name}': a train batch is not as long as the batch_size it was asked for (found "
                       f"after step {step}): batch with ds.batch(batch_size, drop_remainder=True), and filter before "
                       "batching")
  raised = _PYTHON_ERROR.findall(text)
  frames = [(path, line) for path, line in _USER_FRAME.findall(text) if "site-packages" not in path]
  what = f"{raised[-1][0]}: {raised[-1][1]}" if raised else error.message.strip().splitlines()[0]
  at = f" (in {frames[-1][0]}:{frames[-1][1]})" if frames else ""
  return InputPipelineError(f"data.name='{name}': reading the train batch of step {step + 1} failed: {what}{at}")


def _call(name, fn, split, *, batch_size, context, seed=0, epoch=0):
  seed, epoch = (tf.cast(v, tf.int64) for v in (seed, epoch))
  ds = tf.autograph.experimental.do_not_convert(fn)(split, batch_size=batch_size, context=context, seed=seed,
                                                    epoch=epoch)  # the user's Python runs as Python when traced
  if not isinstance(ds, tf.data.Dataset):
    raise ConfigError(f"data.name='{name}': {name.split(':')[1]}('{split}', ...) must return a tf.data.Dataset "
                      f"of (features, targets) batches, got {type(ds).__name__}")
  if not (isinstance(ds.element_spec, tuple) and len(ds.element_spec) == 2):
    raise ConfigError(f"data.name='{name}': the '{split}' dataset's elements must be (features, targets), got "
                      f"{ds.element_spec}")
  return ds


def _length(name, split, ones):
  """Examples in the split: the length of its dataset at batch_size=1."""
  length = int(ones.cardinality())
  if length < 0:
    raise ConfigError(f"data.name='{name}': the length of the '{split}' dataset is unknown to tf.data; declare it "
                      f"with ds.apply(tf.data.experimental.assert_cardinality(number_of_batches))")
  return length


def _whole_batch(name, batch_size, features, targets):
  """A runtime check that every train batch holds batch_size examples (a short one would bias the GLOBAL mean)."""
  rows = tf.shape(tf.nest.flatten(features)[0])[0]
  check = tf.debugging.assert_equal(rows, batch_size, message=(
      f"data.name='{name}': {_NOT_WHOLE} (use batch(batch_size, drop_remainder=True))"))
  with tf.control_dependencies([check]):
    return tf.nest.map_structure(tf.identity, (features, targets))
