"""Prediction files (mode=predict): DIR/part-00000.npz, part-00001.npz, ... hold each example's outputs in input
order, `rows_per_file` rows each (the last fewer), every part written whole or not at all; DIR/run.json says what
they are predictions of, DIR/manifest.json (written last) lists the parts. A rerun after a kill resumes after the
last whole part. Read them with numpy alone:

  parts = sorted(glob.glob("runs/digits/predictions/digits_test-300/part-*.npz"))
  probabilities = np.concatenate([np.load(p)["probabilities"] for p in parts])
"""

import io
import json
import posixpath

import numpy as np
import tensorflow as tf

from errors import ConfigError

RUN, MANIFEST = "run.json", "manifest.json"


def part_name(number):
  return f"part-{number:05d}.npz"


class Files:
  """The chief's writer of one prediction directory.

  Args:
    directory: DIR (any tf.io.gfile path).
    rows_per_file: rows of each part but the last.
    about: what the rows are predictions of ({checkpoint, step, input, examples}); a rerun must match it.
  """

  def __init__(self, directory, rows_per_file, about):
    self.directory, self.rows_per_file = directory, rows_per_file
    self.about = {**about, "rows_per_file": rows_per_file}
    self._pending, self._written, self.next_index, self._shapes = [], [], 0, {}

  @property
  def complete(self):
    return tf.io.gfile.exists(self._path(MANIFEST))

  def start(self, same_checkpoint=None):
    """The rows already written (0 for a new directory; every example when it is complete), after checking that
    the directory holds predictions of the same checkpoint and input. same_checkpoint(there, now): whether two
    checkpoint paths hold the same weights (a best checkpoint and its step's periodic one); the directory keeps
    the first one's name."""
    recorded = self._read(RUN)
    if recorded is None:
      tf.io.gfile.makedirs(self.directory)
      self._write(RUN, json.dumps(self.about, indent=2).encode())
      return 0
    differ = sorted(k for k in set(recorded) | set(self.about) if recorded.get(k) != self.about.get(k))
    if differ == ["checkpoint"] and same_checkpoint and same_checkpoint(recorded["checkpoint"],
                                                                        self.about["checkpoint"]):
      self.about = recorded
    elif differ:
      changes = "; ".join(f"{k} {recorded.get(k)!r} there, {self.about.get(k)!r} now" for k in differ)
      raise ConfigError(f"{self.directory} holds other predictions ({changes}); remove it to predict again")
    if self.complete:
      self._written = self._read(MANIFEST)["files"]
      self.next_index = self.about["examples"]
      return self.next_index
    while tf.io.gfile.exists(self._path(part_name(len(self._written)))):
      rows = self._rows_of(part_name(len(self._written)))
      self._written.append({"file": part_name(len(self._written)), "rows": rows, "first": self.next_index})
      self.next_index += rows
    return self.next_index

  def manifest(self):
    """The manifest of a complete directory."""
    return self._read(MANIFEST)

  def add(self, index, columns):
    """Rows `index` (the next examples, in order) with {name: numpy [rows, ...]}; whole parts are written."""
    expected = np.arange(self.next_index, self.next_index + len(index))
    if not np.array_equal(index, expected):
      raise RuntimeError(f"prediction rows out of order: got examples {index[:4]}..., expected {expected[:4]}...")
    self._check_shapes(columns)
    self._pending.append({"index": index, **columns})
    self.next_index += len(index)
    while sum(len(rows["index"]) for rows in self._pending) >= self.rows_per_file:
      self._flush(self.rows_per_file)

  def _check_shapes(self, columns):
    """Every row of a column has one shape: a part is one array per column."""
    shapes = {name: value.shape[1:] for name, value in columns.items()}
    for name, shape in shapes.items():
      first = self._shapes.setdefault(name, shape)
      if shape != first:
        raise ConfigError(f"prediction output '{name}' has per-example shape {list(first)} in one batch and "
                          f"{list(shape)} in another (sequences padded per batch?): return a fixed shape from "
                          f"predict_step, e.g. padded to the longest length the data has")

  def finish(self, extra):
    """Writes the last part and the manifest ({about, files, columns, **extra}); returns the manifest."""
    if self._pending:
      self._flush(sum(len(rows["index"]) for rows in self._pending))
    first = self._path(self._written[0]["file"]) if self._written else None
    columns = {}
    if first:
      with np.load(io.BytesIO(tf.io.gfile.GFile(first, "rb").read())) as part:
        columns = {name: {"dtype": str(part[name].dtype), "shape": list(part[name].shape[1:])} for name in part.files}
    manifest = {**self.about, "files": self._written, "columns": columns, **extra}
    self._write(MANIFEST, json.dumps(manifest, indent=2).encode())
    return manifest

  def _flush(self, rows):
    joined = {name: np.concatenate([p[name] for p in self._pending]) for name in self._pending[0]}
    part, rest = ({name: value[:rows] for name, value in joined.items()},
                  {name: value[rows:] for name, value in joined.items()})
    self._pending = [rest] if len(rest["index"]) else []
    buffer = io.BytesIO()
    np.savez(buffer, **part)
    name = part_name(len(self._written))
    self._write(name, buffer.getvalue())
    self._written.append({"file": name, "rows": rows, "first": int(part["index"][0])})

  def _rows_of(self, name):
    with np.load(io.BytesIO(tf.io.gfile.GFile(self._path(name), "rb").read())) as part:
      index = part["index"]
    if not np.array_equal(index, np.arange(self.next_index, self.next_index + len(index))):
      raise ConfigError(f"{self._path(name)} does not continue the parts before it (examples {index[:1]}..., "
                        f"expected {self.next_index}); remove {self.directory} to predict again")
    return len(index)

  def _path(self, name):
    return posixpath.join(self.directory, name)

  def _read(self, name):
    path = self._path(name)
    return json.loads(tf.io.gfile.GFile(path).read()) if tf.io.gfile.exists(path) else None

  def _write(self, name, payload):
    """Whole or not at all: a temporary file renamed over the name."""
    path = self._path(name)
    with tf.io.gfile.GFile(path + ".tmp", "wb") as f:
      f.write(payload)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
