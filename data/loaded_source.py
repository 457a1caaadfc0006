"""What a data source gives the rest of the run: `Source`, and `from_arrays` for data held in memory."""

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Source:
  """train/eval: unbatched (image, label) datasets in a fixed order. When the train split is loaded in memory,
  train_arrays holds it as numpy (images, labels) so the pipeline can shuffle all of it by index."""
  name: str
  train: tf.data.Dataset
  eval: tf.data.Dataset
  train_size: int
  eval_size: int
  num_classes: int
  image_shape: tuple  # stored shape (H, W, C), before resizing.
  max_value: float  # pixel value that maps to 1.0.
  train_arrays: tuple = None
  # Records that need decoding: train/eval yield (record, label) (a file path, encoded bytes) and decode(record) is
  # the uint8 image of image_shape; the pipeline orders, shards and skips records and decodes only those it keeps.
  decode: object = None
  # The train split's records held in memory as numpy (records, labels) (image_folder streamed: file paths): the
  # per-epoch permutation of in-memory data, then decode.
  train_records: tuple = None
  # The train split as files of records (records.RecordFiles; tfrecord, tfds streamed): read by data/records.py.
  train_files: object = None
  # A user's input function (data/user_stream.py): train pipelines call it per epoch; train/eval are its examples.
  input_fn: object = None
  # A task's named streams of that input function (user_stream.Stream, the main one first; train/train_size are
  # the main one's) and the stream whose eval split `eval` is; None for one stream.
  streams: tuple = None
  eval_stream: str = None


def from_arrays(name, train, evaluation, num_classes, max_value):
  """A Source held in memory: train and evaluation are (images, labels) numpy pairs."""
  return Source(
      name=name,
      train=tf.data.Dataset.from_tensor_slices(train),
      eval=tf.data.Dataset.from_tensor_slices(evaluation),
      train_size=len(train[1]), eval_size=len(evaluation[1]), num_classes=num_classes,
      image_shape=tuple(train[0].shape[1:]), max_value=max_value, train_arrays=train)
