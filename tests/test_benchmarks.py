"""Smoke runs of both benchmark commands (one tiny window each), so they cannot rot. Full runs: -m slow."""

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

THROUGHPUT_KEYS = ("images_per_sec", "ratio_vs_keras_fit", "ratio_vs_bare_loop", "ratio_real_vs_synthetic",
                   "gemm_peak_gflops", "model_gflops_per_image", "fraction_of_peak", "config", "versions")


def run_module(*args, timeout=900):
  result = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  return result


def check_throughput(out):
  results = json.load(open(out))
  for key in THROUGHPUT_KEYS:
    assert key in results, key
  assert set(results["images_per_sec"]) == {"framework", "keras_fit", "bare_loop", "synthetic"}
  assert all(v > 0 for v in results["images_per_sec"].values())
  rates = results["images_per_sec"]
  assert results["ratio_vs_keras_fit"] == pytest.approx(rates["framework"] / rates["keras_fit"])
  assert 10 < results["gemm_peak_gflops"] < 1e5
  assert 0 < results["model_gflops_per_image"] < 1
  return results


def test_throughput_benchmark_smoke(tmp_path):
  out = tmp_path / "results.json"
  result = run_module("benchmarks.throughput", "--config=configs/digits_cnn.py", "--windows=1",
                      "--window_calls=1", "--config.train.steps_per_loop=5", f"--out={out}")
  assert "ratio_vs_keras_fit" in result.stdout and "framework" in result.stdout
  results = check_throughput(out)
  assert results["steps_per_window"] == 5


def test_scaling_benchmark_smoke(tmp_path):
  out = tmp_path / "scaling"
  run_module("benchmarks.scaling", "--config=configs/digits_cnn.py", f"--out={out}", "--epochs=3")  # as shipped
  summary = json.load(open(out / "scaling.json"))
  assert summary["efficiency_2_workers"] == pytest.approx(summary["speedup_2_workers"] / 2)
  rows = list(csv.DictReader(open(out / "scaling.csv")))
  assert [(r["setup"], r["replicas"]) for r in rows] == [
      ("mirrored", "1"), ("mirrored", "2"), ("multi_worker", "1"), ("multi_worker", "2")]
  assert [int(r["global_batch_size"]) for r in rows] == [64, 128, 64, 128]
  for png in ("epoch_time.png", "images_per_sec.png", "speedup.png"):
    assert (out / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize("config", ["digits_cnn", "mnist_cnn:synthetic"])
def test_throughput_full(config, tmp_path):
  out = tmp_path / "results.json"
  run_module("benchmarks.throughput", f"--config=configs/{config.split(':')[0]}.py" +
             (":synthetic" if ":" in config else ""), "--windows=5", "--window_calls=10", f"--out={out}")
  print(json.dumps({k: v for k, v in check_throughput(out).items() if k not in ("config", "window_seconds")},
                   indent=1))


def test_ab_runs_a_command_on_a_base_commit_and_the_working_tree_alternately(tmp_path):
  """benchmarks.ab with a command that reports which tree it ran in: base rounds run in a worktree of the base."""
  probe = "import json, os, sys; json.dump({'cwd_is_repo': float(os.getcwd() == sys.argv[2])}, open(sys.argv[1], 'w'))"
  result = run_module("benchmarks.ab", "--base=HEAD~1", "--rounds=2", "--key=cwd_is_repo", "--", "python", "-c",
                      probe, "{out}", REPO)
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["results"]["cwd_is_repo"]["base"] == [0.0, 0.0]  # base ran in its own worktree
  assert summary["results"]["cwd_is_repo"]["head"] == [1.0, 1.0]


def test_ab_compares_two_variants_of_the_working_tree_by_their_arguments():
  probe = "import json, sys; json.dump({'value': float(sys.argv[2])}, open(sys.argv[1], 'w'))"
  result = run_module("benchmarks.ab", "--rounds=2", "--key=value", "--base_args=2", "--head_args=3", "--", "python",
                      "-c", probe, "{out}")
  summary = json.loads(result.stdout.strip().splitlines()[-1])["results"]["value"]
  assert summary["base"] == [2.0, 2.0] and summary["head"] == [3.0, 3.0]
  assert summary["ratio_head_vs_base"] == 1.5
