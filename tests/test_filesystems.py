"""A workdir on any filesystem TensorFlow knows: a whole run on ram:// (TensorFlow's in-memory filesystem, which
stands in for gs:// and the like), with nothing written to the local disk."""

import pytest
import json
import os
import re

from absl import logging as absl_logging
import tensorflow as tf

from loops import run
from tests.conftest import REPO


def files_under(root):
  return sorted(posixpath_join(d, f) for d, _, names in tf.io.gfile.walk(root) for f in names)


def posixpath_join(directory, name):
  return directory.rstrip("/") + "/" + name


def read_json(path):
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


@pytest.mark.e2e
def test_a_run_on_ram_trains_resumes_keeps_best_exports_and_writes_nothing_locally(tiny_digits, tmp_path,
                                                                                   monkeypatch, caplog):
  monkeypatch.chdir(tmp_path)
  workdir = "ram://runs/fs-e2e"
  c = tiny_digits
  c.summary.profile_steps = (5, 10)
  first = run.train_and_evaluate(c, workdir)
  assert first["checkpoint"] == f"{workdir}/checkpoints/ckpt-20"
  assert first["best_checkpoint"] == f"{workdir}/best/ckpt-{first['best_step']}"
  assert first["export"] == {"keras": f"{workdir}/export/model.keras", "saved_model": f"{workdir}/export/saved_model"}

  c.train.steps = 30  # the same process resumes from the saved step on the same filesystem
  absl_logging.set_verbosity(absl_logging.INFO)
  second = run.train_and_evaluate(c, workdir)
  assert f"restored {workdir}/checkpoints/ckpt-20" in caplog.text
  assert second["step"] == 30 and second["checkpoint"] == f"{workdir}/checkpoints/ckpt-30"

  files = files_under(workdir)
  for name in ("config.json", "summary.json", "best/best.json", "export/model.keras",
               "export/saved_model/saved_model.pb", "checkpoints/checkpoint",
               "checkpoints/ckpt-30.index", f"best/ckpt-{second['best_step']}.index"):
    assert f"{workdir}/{name}" in files, files
  assert len([f for f in files if "/events.out.tfevents." in f]) == 2
  assert any(re.search(r"/profile/plugins/profile/[^/]+/[^/]+\.xplane\.pb$", f) for f in files), files
  assert not any(f.endswith((".tmp", "run.lock")) for f in files), files  # atomic writes renamed; lock released
  assert read_json(f"{workdir}/summary.json")["step"] == 30
  assert read_json(f"{workdir}/best/best.json")["step"] == second["best_step"]
  assert read_json(f"{workdir}/config.json")["train"]["steps"] == 30
  assert os.listdir(tmp_path) == []  # nothing under the working directory (e.g. a folder named "ram:")
  assert not os.path.exists(os.path.join(REPO, "ram:"))


@pytest.mark.e2e
def test_a_damaged_checkpoint_on_ram_is_set_aside_there(tiny_digits, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  workdir = "ram://runs/fs-damaged"
  run.train_and_evaluate(tiny_digits, workdir)
  [data_file] = tf.io.gfile.glob(f"{workdir}/checkpoints/ckpt-20.data-*")
  with tf.io.gfile.GFile(data_file, "rb") as f:
    damaged = bytearray(f.read())
  damaged[len(damaged) // 2] ^= 0xFF
  tf.io.gfile.remove(data_file)  # ram:// appends on "wb" to an existing file
  with tf.io.gfile.GFile(data_file, "wb") as f:
    f.write(bytes(damaged))
  tiny_digits.train.steps = 30
  summary = run.train_and_evaluate(tiny_digits, workdir)
  assert summary["step"] == 30
  aside = tf.io.gfile.listdir(f"{workdir}/checkpoints/unreadable")
  assert sorted(aside) == ["ckpt-20.data-00000-of-00001", "ckpt-20.index"], aside
  assert os.listdir(tmp_path) == []


@pytest.mark.e2e
def test_main_with_a_ram_workdir_reports_it_as_given_and_creates_no_local_folder():
  from tests.conftest import run_main
  result = run_main("--config=configs/digits_cnn.py", "--workdir=ram://runs/main", "--config.train.epochs=0.5",
                    "--config.summary.progress_bar=off")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "exported ram://runs/main/export/model.keras" in result.stderr
  dry = run_main("--config=configs/digits_cnn.py", "--workdir=ram://runs/main", "--dry_run")
  assert "  workdir: ram://runs/main\n" in dry.stdout and "  checkpoints: ram://runs/main/checkpoints\n" in dry.stdout
  assert not os.path.exists(os.path.join(REPO, "ram:"))
