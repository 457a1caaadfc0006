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

Several named streams (a task's `streams = {"labeled": 1, "unlabeled": 7}`: each stream's global batch as a
multiple of the run's): the function also takes `stream` and is called per stream, each stream's epochs chained
on their own (its own length), its position on resume the step times its batch; a step's element is
({stream: features}, {stream: targets}). The eval split is read once, with `stream` the task's eval stream.
"""

import dataclasses
import inspect
import re

import tensorflow as tf

from data.loaded_source import Source
from errors import ConfigError, InputPipelineError

_MAX_EPOCHS = 1 << 40
_EVAL_READ = 128  # the eval split is read in batches of this many (then padded and sharded as examples)
_WHOLE = tf.distribute.InputContext()  # one pipeline, one replica


@dataclasses.dataclass(frozen=True)
class Stream:
  """One named train stream of an input function: its global batch is `multiple` x the run's; `size` examples
  per epoch."""
  name: str
  multiple: int
  size: int


def is_input_function(fn):
  try:
    return "context" in inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return False


def load(name, fn, streams=None, eval_stream=None):
  """The Source of an input function: its splits' lengths and element specs, from three calls per stream (train
  and eval one example per batch, eval as it is read). streams: {name: multiple} of a task's named streams (the
  first the main one: the run's epoch and train split), eval_stream: the one whose eval split is read."""
  if not streams:
    train, train_size = _train_examples(name, fn, None)
    evaluation, eval_size = _eval_examples(name, fn, None, train)
    return Source(name=name, train=train, eval=evaluation, train_size=train_size, eval_size=eval_size,
                  num_classes=0, image_shape=None, max_value=1.0, input_fn=fn)
  if "stream" not in inspect.signature(fn).parameters:
    raise ConfigError(f"data.name='{name}': the task reads the streams {list(streams)}, so the input function "
                      f"must take a `stream` keyword: {name.split(':')[1]}(split, *, stream, batch_size, context, "
                      f"seed, epoch)")
  examples = {stream: _train_examples(name, fn, stream) for stream in streams}
  main = next(iter(streams))
  eval_stream = eval_stream or main
  evaluation, eval_size = _eval_examples(name, fn, eval_stream, examples[eval_stream][0])
  return Source(name=name, train=examples[main][0], eval=evaluation, train_size=examples[main][1],
                eval_size=eval_size, num_classes=0, image_shape=None, max_value=1.0, input_fn=fn,
                streams=tuple(Stream(s, int(m), examples[s][1]) for s, m in streams.items()),
                eval_stream=eval_stream)


def _train_examples(name, fn, stream):
  """(the train split's examples, unbatched; their number) of `stream` (None: the one stream)."""
  ones = _call(name, fn, "train", batch_size=1, context=_WHOLE, stream=stream)
  return ones.unbatch(), _length(name, _split_name("train", stream), ones)


def _eval_examples(name, fn, stream, train):
  """(the eval split's examples, unbatched; their number), checked: every example kept, the train split's spec.
  Sequences padded per batch (an unknown dimension) are read one by one, each at its own length."""
  ones = _call(name, fn, "eval", batch_size=1, context=_WHOLE, stream=stream)
  size = _length(name, "'eval'", ones)
  if has_unknown_dims(ones.element_spec):
    evaluation = ones.unbatch()
  else:
    evaluation = _call(name, fn, "eval", batch_size=_EVAL_READ, context=_WHOLE, stream=stream)
    read = int(evaluation.cardinality())
    if read < 0:
      raise ConfigError(f"data.name='{name}': the length of the 'eval' dataset at batch_size={_EVAL_READ} is "
                        f"unknown to tf.data; declare it with ds.apply(tf.data.experimental.assert_cardinality("
                        f"number_of_batches))")
    if read * _EVAL_READ < size:
      raise ConfigError(f"data.name='{name}': the 'eval' dataset drops its last partial batch (batch(..., "
                        f"drop_remainder=True)); the eval must see every example: batch it without dropping")
    evaluation = evaluation.unbatch()
  if train.element_spec != evaluation.element_spec:
    raise ConfigError(f"data.name='{name}': the eval split's batches {evaluation.element_spec} differ from the "
                      f"{_split_name('train', stream)} split's {train.element_spec}")
  return evaluation, size


def has_unknown_dims(element_spec, batched=True):
  """True when some feature or target of the batches (batched=False: of the examples) has a dimension of unknown
  size besides the batch's (a sequence padded to the longest of its batch: padded_batch, bucket_by_sequence_length)."""
  specs = [s for s in tf.nest.flatten(element_spec) if isinstance(s, tf.TensorSpec)]
  return any(s.shape.rank is None or None in s.shape.as_list()[int(batched):] for s in specs)


def _split_name(split, stream):
  return f"'{split}'" if stream is None else f"'{split}' (stream '{stream}')"


def stream_steps(stream, global_batch):
  """Steps an epoch of `stream` has when the run's global batch is `global_batch`."""
  return stream.size // (global_batch * stream.multiple)


def stream_batches(source, *, batch_size, steps_per_epoch, seed, start_step, num_shards, shard_index,
                   local_replicas, decorrelate=False):
  """This pipeline's ({stream: features}, {stream: targets}) from global step `start_step`: each stream its own
  input function's batches of batch_size x its multiple, its epochs chained at its own length (train_batches;
  steps_per_epoch is the main stream's), one element per local replica and step."""
  global_batch = batch_size * num_shards * local_replicas
  per_stream = {s.name: train_batches(source, batch_size=batch_size * s.multiple,
                                      steps_per_epoch=stream_steps(s, global_batch), seed=seed,
                                      start_step=start_step, num_shards=num_shards, shard_index=shard_index,
                                      local_replicas=local_replicas, decorrelate=decorrelate, stream=s.name)
                for s in source.streams}
  return tf.data.Dataset.zip(per_stream).map(lambda element: (
      {name: pair[0] for name, pair in element.items()}, {name: pair[1] for name, pair in element.items()}))


def train_batches(source, *, batch_size, steps_per_epoch, seed, start_step, num_shards, shard_index,
                  local_replicas, decorrelate=False, stream=None):
  """This pipeline's batches of `batch_size` from global step `start_step`, one per local replica and step
  (decorrelate: each epoch's seed mixed with the clock, for asynchronous parameter-server workers; stream: the
  named stream the function is asked for)."""
  from data.pipeline import decorrelated  # data.pipeline imports this module
  context = tf.distribute.InputContext(num_shards, shard_index, num_shards * local_replicas)
  per_epoch, start = steps_per_epoch * local_replicas, start_step * local_replicas
  start_epoch, skip = divmod(int(start), int(per_epoch))

  def one_epoch(epoch):
    epoch_seed = decorrelated(seed) if decorrelate else seed
    ds = _call(source.name, source.input_fn, "train", batch_size=batch_size, context=context, seed=epoch_seed,
               epoch=epoch, stream=stream).take(per_epoch)
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


# The graph-level seed of an epoch's trace when the run's is 0: TensorFlow's get_seed compares an op's seed with 0 in
# Python when the global seed is 0, so ds.shuffle(n, seed=seed + epoch) (a tensor) cannot be traced under it.
TENSOR_SEEDS_GRAPH_SEED = 2**31


def _call(name, fn, split, *, batch_size, context, seed=0, epoch=0, stream=None):
  seed, epoch = (tf.cast(v, tf.int64) for v in (seed, epoch))
  named = {} if stream is None else {"stream": stream}
  call = lambda: tf.autograph.experimental.do_not_convert(fn)(split, batch_size=batch_size, context=context,
                                                               seed=seed, epoch=epoch, **named)  # Python as Python
  try:
    ds = call()
  except tf.errors.OperatorNotAllowedInGraphError:
    graph_seed = tf.compat.v1.get_default_graph().seed
    if tf.executing_eagerly() or graph_seed is None or graph_seed % (2**31 - 1) != 0:
      raise
    tf.random.set_seed(TENSOR_SEEDS_GRAPH_SEED)  # this epoch's trace only: a seed tf.data takes beside a tensor
    ds = call()
  if not isinstance(ds, tf.data.Dataset):
    raise ConfigError(f"data.name='{name}': {name.split(':')[1]}('{split}', ...) must return a tf.data.Dataset "
                      f"of (features, targets) batches, got {type(ds).__name__}")
  if not (isinstance(ds.element_spec, tuple) and len(ds.element_spec) == 2):
    raise ConfigError(f"data.name='{name}': the '{split}' dataset's elements must be (features, targets), got "
                      f"{ds.element_spec}")
  if any(isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)) for spec in tf.nest.flatten(
      ds.element_spec, expand_composites=False)):
    raise ConfigError(f"data.name='{name}': the '{split}' batches hold ragged or sparse tensors (ds.ragged_batch, "
                      "tf.sparse): a step takes dense tensors; batch sequences with ds.padded_batch(batch_size, "
                      "drop_remainder=True) (each padded to its batch's longest) or densify them in a map")
  return ds


def _length(name, split, ones):
  """Examples in the split: the length of its dataset at batch_size=1."""
  length = int(ones.cardinality())
  if length < 0:
    raise ConfigError(f"data.name='{name}': the length of the {split} dataset is unknown to tf.data; declare it "
                      f"with ds.apply(tf.data.experimental.assert_cardinality(number_of_batches))")
  return length


def _whole_batch(name, batch_size, features, targets):
  """A runtime check that every train batch holds batch_size examples (a short one would bias the GLOBAL mean)."""
  rows = tf.shape(tf.nest.flatten(features)[0])[0]
  check = tf.debugging.assert_equal(rows, batch_size, message=(
      f"data.name='{name}': {_NOT_WHOLE} (use batch(batch_size, drop_remainder=True))"))
  with tf.control_dependencies([check]):
    return tf.nest.map_structure(tf.identity, (features, targets))
