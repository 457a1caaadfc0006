"""loops/persist/predictions.py without TensorFlow's step: whole parts in order, a resume after the last whole part,
another run's directory refused, rows out of order or of changing shape refused."""

import json

import numpy as np
import pytest

from errors import ConfigError
from loops.persist import predictions

ABOUT = {"checkpoint": "w/checkpoints/ckpt-20", "step": 20, "input": "digits:test", "examples": 25}


def write(directory, batches, rows_per_file=10, about=ABOUT):
  files = predictions.Files(str(directory), rows_per_file, about)
  start = files.start()
  for first in range(start, about["examples"], batches):
    index = np.arange(first, min(first + batches, about["examples"]))
    files.add(index, {"value": index * 2.0})
  return files, start


def test_parts_hold_rows_per_file_rows_in_order_and_the_manifest_lists_them(tmp_path):
  files, _ = write(tmp_path, batches=4)
  manifest = files.finish({"seconds": 1.0})
  assert [(f["file"], f["rows"], f["first"]) for f in manifest["files"]] == [
      ("part-00000.npz", 10, 0), ("part-00001.npz", 10, 10), ("part-00002.npz", 5, 20)]
  assert manifest["columns"] == {"index": {"dtype": "int64", "shape": []}, "value": {"dtype": "float64", "shape": []}}
  assert json.load(open(tmp_path / "manifest.json")) == manifest
  value = np.concatenate([np.load(tmp_path / f["file"])["value"] for f in manifest["files"]])
  assert np.array_equal(value, np.arange(25) * 2.0)


def test_a_rerun_starts_after_the_last_whole_part_and_ends_with_the_same_files(tmp_path):
  files, _ = write(tmp_path, batches=3)
  files.finish({})
  whole = {name: np.load(tmp_path / name)["value"] for name in ("part-00000.npz", "part-00001.npz", "part-00002.npz")}
  (tmp_path / "part-00002.npz").unlink()
  (tmp_path / "manifest.json").unlink()
  files, start = write(tmp_path, batches=7)
  assert start == 20
  files.finish({})
  for name, value in whole.items():
    assert np.array_equal(np.load(tmp_path / name)["value"], value), name
  assert predictions.Files(str(tmp_path), 10, ABOUT).start() == 25  # complete: nothing left


def test_another_runs_directory_is_refused_in_one_line(tmp_path):
  write(tmp_path, batches=5)
  with pytest.raises(ConfigError, match=r"^.* holds other predictions \(checkpoint 'w/checkpoints/ckpt-20' there, "
                                        r"'best/ckpt-20' now\); remove it to predict again$"):
    predictions.Files(str(tmp_path), 10, {**ABOUT, "checkpoint": "best/ckpt-20"}).start()


def test_another_checkpoint_of_the_same_weights_goes_on_in_the_directory(tmp_path):
  """predict.checkpoint=20 after =best of step 20: refused as other predictions (the paths differ) before."""
  write(tmp_path, batches=5)
  asked = []

  def same(there, now):
    asked.append((there, now))
    return True

  best = {**ABOUT, "checkpoint": "w/best/ckpt-20"}
  assert predictions.Files(str(tmp_path), 10, best).start(same) == 20  # after its last whole part
  assert asked == [("w/checkpoints/ckpt-20", "w/best/ckpt-20")]
  assert json.load(open(tmp_path / "run.json"))["checkpoint"] == "w/checkpoints/ckpt-20"  # the name it was made with
  with pytest.raises(ConfigError, match=r"holds other predictions \(checkpoint 'w/checkpoints/ckpt-20' there, "):
    predictions.Files(str(tmp_path), 10, best).start(lambda there, now: False)
  with pytest.raises(ConfigError, match=r"holds other predictions \(checkpoint .*; step 20 there, 30 now\)"):
    predictions.Files(str(tmp_path), 10, {**best, "step": 30}).start(same)  # the weights' question is not asked


def test_rows_out_of_order_and_a_changing_shape_are_refused(tmp_path):
  files = predictions.Files(str(tmp_path), 10, ABOUT)
  files.start()
  with pytest.raises(RuntimeError, match="out of order"):
    files.add(np.array([1, 0]), {"value": np.zeros(2)})
  files.add(np.array([0, 1]), {"tokens": np.zeros([2, 7])})
  with pytest.raises(ConfigError, match=r"^prediction output 'tokens' has per-example shape \[7\] in one batch and "
                                        r"\[9\] in another"):
    files.add(np.array([2, 3]), {"tokens": np.zeros([2, 9])})
