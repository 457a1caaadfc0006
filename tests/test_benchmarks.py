"""Smoke runs of the benchmark commands (one tiny window each), so they cannot rot, and the scaling study's
arithmetic on fake runs. Full runs: -m slow."""

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_config

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
  contenders = {"framework", "keras_fit", "bare_loop", "synthetic"}
  contenders |= {"host_pipeline", "input_only"} if results["device_resident"] else set()
  contenders |= {"framework_keras_bn"} if results["fused_batchnorm_layers"] else set()
  assert set(results["images_per_sec"]) == contenders
  if results["fused_batchnorm_layers"]:
    rates = results["images_per_sec"]
    assert results["ratio_fused_vs_keras_bn"] == pytest.approx(rates["framework"] / rates["framework_keras_bn"])
    assert results["ratio_keras_bn_vs_keras_fit"] == pytest.approx(rates["framework_keras_bn"] / rates["keras_fit"])
  if results["device_resident"]:
    assert results["input_share_of_step"] == pytest.approx(
        results["images_per_sec"]["framework"] / results["images_per_sec"]["input_only"])
    assert results["ratio_host_pipeline_vs_synthetic"] == pytest.approx(
        results["images_per_sec"]["host_pipeline"] / results["images_per_sec"]["synthetic"])
  assert all(v > 0 for v in results["images_per_sec"].values())
  rates = results["images_per_sec"]
  assert results["ratio_vs_keras_fit"] == pytest.approx(rates["framework"] / rates["keras_fit"])
  assert 10 < results["gemm_peak_gflops"] < 1e5
  assert 0 < results["model_gflops_per_image"] < 1
  units = results["versions"]["cpu_half_precision_units"]  # which CPU a figure came from (bfloat16: 0.19x to 1.4x)
  assert set(units) <= {"avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}
  assert ("avx512_bf16" in units) == ("avx512_bf16" in open("/proc/cpuinfo").read())
  return results


@pytest.mark.e2e
def test_throughput_benchmark_smoke(tmp_path):
  """One tiny window per contender on a ResNet-8 (ResNet-20's code with one block per stage; BatchNorm: the
  framework fuses it, and is measured with Keras' BatchNorm too) over device-resident synthetic data (the host
  pipeline measured beside it)."""
  out = tmp_path / "results.json"
  result = run_module("benchmarks.throughput", "--config=configs/cifar_resnet20.py:synthetic", "--windows=1",
                      "--window_calls=1", "--config.train.steps_per_loop=2", "--config.train.global_batch_size=8",
                      "--config.model.kwargs.blocks_per_stage=1", f"--out={out}")
  assert "ratio_vs_keras_fit" in result.stdout and "ratio_fused_vs_keras_bn" in result.stdout
  results = check_throughput(out)
  assert results["fused_batchnorm_layers"] == 9  # stem, 3 stages x 1 block x 2, 2 shortcuts
  assert results["steps_per_window"] == 2
  assert results["device_resident"] and "train input: device-resident" in result.stdout


def test_predict_benchmark_smoke(tmp_path):
  """One round of mode=predict and Keras' model.predict on 512 examples: both rates and their paired ratio."""
  out = tmp_path / "predict.json"
  run_module("benchmarks.predict", "--examples=512", "--batch=64", "--rounds=1", f"--out={out}")
  results = json.load(open(out))
  assert set(results["examples_per_sec"]) == {"framework", "keras_predict"}
  assert all(rate > 0 for rate in results["examples_per_sec"].values())
  expected = results["every_round"]["framework"][0] / results["every_round"]["keras_predict"][0]
  assert results["ratio_vs_keras_predict_paired"] == pytest.approx(expected, rel=0.01)


def test_remat_benchmark_smoke(tmp_path):
  """One round of ResNet-20 (1 block per stage, batch 16) without and with blocks recomputed: each mode's step
  memory and rate, and the ratios to no remat (blocks keep less)."""
  out = tmp_path / "remat.json"
  run_module("benchmarks.remat", "--config=configs/cifar_resnet20.py:synthetic", "--modes=,blocks", "--rounds=1",
             "--steps=4", "--override=train.global_batch_size=16", "--override=model.kwargs.blocks_per_stage=1",
             f"--out={out}")
  results = json.load(open(out))["results"]
  assert set(results) == {"off", "blocks"}
  assert results["off"]["memory_mb.step_added_mb_ratio"] == 1.0 and results["blocks"]["examples_per_sec"] > 0
  assert results["blocks"]["memory_mb.step_added_mb"] == pytest.approx(
      results["blocks"]["memory_mb.step_added_mb_ratio"] * results["off"]["memory_mb.step_added_mb"], rel=1e-6)
  assert results["blocks"]["memory_mb.step_added_mb_ratio"] < 1.0


def test_throughput_ratios_are_those_whose_two_contenders_ran_paired_by_round():
  from benchmarks import ratios
  seconds = {"framework": [1.0, 2.0, 1.0], "synthetic": [0.9, 1.9, 1.0]}  # per-round ratios 0.9, 0.95, 1.0
  rates = {"framework": 10.0, "synthetic": 12.0, "lever_xla": 15.0}
  found = ratios.ratios(rates, seconds)
  assert set(found) == {"ratio_real_vs_synthetic", "ratio_real_vs_synthetic_paired", "ratio_lever_xla"}
  assert found["ratio_real_vs_synthetic"] == pytest.approx(10 / 12)
  assert found["ratio_real_vs_synthetic_paired"] == pytest.approx(0.95)
  assert found["ratio_lever_xla"] == pytest.approx(1.5)


@pytest.mark.e2e
def test_throughput_times_only_the_contenders_asked_for_and_their_ratios(tmp_path):
  out = tmp_path / "results.json"
  result = run_module("benchmarks.throughput", "--config=configs/digits_cnn.py", "--windows=2", "--window_calls=1",
                      "--config.train.steps_per_loop=2", "--contenders=framework,synthetic,input_only,user_task",
                      f"--out={out}")
  results = json.load(open(out))
  assert set(results["images_per_sec"]) == {"framework", "synthetic", "input_only", "user_task"}
  assert "ratio_vs_keras_fit" not in results and "ratio_vs_keras_fit" not in result.stdout
  assert results["ratio_real_vs_synthetic_paired"] > 0 and "input_share_of_step" in result.stdout
  assert results["ratio_user_task_vs_built_in_paired"] > 0 and "ratio_user_task_vs_built_in_paired" in result.stdout
  assert all(len(windows) == 2 for windows in results["window_seconds"].values())


def test_throughput_rejects_unknown_contenders_before_building_anything():
  result = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--config=configs/digits_cnn.py",
                           "--contenders=framework,kerasfit"], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert "--contenders must include framework and name only framework,keras_fit," in result.stderr
  assert "got framework,kerasfit" in result.stderr


def test_throughput_reads_the_config_overrides_as_main_py_does():
  """A model's own argument (model.kwargs) is accepted as main.py accepts it; an unknown key is one line naming the
  nearest valid key (the smoke test above proves a model.kwargs value reaches the model: 9 fused layers, not 21)."""
  result = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--config=configs/digits_cnn.py",
                           "--config.train.stepz=3", "--config.model.kwargs.width=8"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "error: unknown config key 'train.stepz' in --config.train.stepz=3 (did you mean 'train.steps'?); valid keys "
      "here: " + ", ".join(sorted(load_config("digits_cnn").train.keys())))


@pytest.mark.e2e
def test_scaling_benchmark_smoke(tmp_path):
  out = tmp_path / "scaling"
  run_module("benchmarks.scaling", "--config=configs/digits_cnn.py", f"--out={out}", "--epochs=3", "--repeats=1",
             "--settle_seconds=0", "--setups=multi_worker")  # one round; mirrored cases' commands: unit tests below
  summary = json.load(open(out / "scaling.json"))
  assert summary["efficiency_2_workers"] == pytest.approx(summary["speedup_2_workers"] / 2)
  rows = [r for r in csv.DictReader(open(out / "scaling.csv")) if r["statistic"] == "median"]
  assert [(r["setup"], r["replicas"]) for r in rows] == [("multi_worker", "1"), ("multi_worker", "2")]
  assert [int(r["global_batch_size"]) for r in rows] == [64, 128]
  assert all(run["epoch_seconds"] > 0 and run["load_before"] >= 0 for run in summary["runs"])
  for png in ("epoch_time.png", "images_per_sec.png", "speedup.png"):
    assert (out / png).read_bytes()[:4] == b"\x89PNG"


def fake_runs(seconds):
  """Runs as benchmarks.scaling.measure records them, from {(setup, replicas): [epoch seconds per repeat]}."""
  return [{"setup": setup, "replicas": replicas, "repeat": repeat, "global_batch_size": 64 * replicas,
           "epoch_seconds": value, "images_per_sec": 6400 / value, "load_before": 1.0, "load_after": 2.0,
           "other_cpu_share": 0.1}
          for (setup, replicas), values in seconds.items() for repeat, value in enumerate(values)]


FAKE_SECONDS = {("mirrored", 1): [1.0, 1.2, 1.1], ("mirrored", 2): [1.0, 1.0, 1.0],
                ("multi_worker", 1): [2.0, 4.0, 2.2], ("multi_worker", 2): [1.0, 2.5, 1.0]}


def test_scaling_schedule_runs_each_pair_back_to_back_alternating_which_goes_first():
  from benchmarks import scaling
  assert scaling.schedule(3, ["mirrored", "multi_worker"]) == [
      ("mirrored", 1, 0), ("mirrored", 2, 0), ("multi_worker", 1, 0), ("multi_worker", 2, 0),
      ("mirrored", 2, 1), ("mirrored", 1, 1), ("multi_worker", 2, 1), ("multi_worker", 1, 1),
      ("mirrored", 1, 2), ("mirrored", 2, 2), ("multi_worker", 1, 2), ("multi_worker", 2, 2)]
  assert scaling.schedule(2, ["multi_worker"]) == [
      ("multi_worker", 1, 0), ("multi_worker", 2, 0), ("multi_worker", 2, 1), ("multi_worker", 1, 1)]


def test_scaling_measure_runs_cases_one_at_a_time_in_order_after_settling():
  from benchmarks import scaling
  events, clock = [], iter(range(100))
  snapshot = lambda: {"time": next(clock) * 10.0, "load": 1.5, "busy_cpu_seconds": None, "own_cpu_seconds": 0.0}

  def run_case(setup, replicas, repeat):
    events.append(("run", setup, replicas, repeat))
    return {"epoch_seconds": 1.0 + replicas, "images_per_sec": 100.0, "global_batch_size": 64}

  order = scaling.schedule(2, ["multi_worker"])
  runs = scaling.measure(order, run_case, 7, sleep=lambda s: events.append(("sleep", s)), snapshot=snapshot)
  assert events == [e for case in order for e in (("sleep", 7), ("run", *case))]
  assert [(r["setup"], r["replicas"], r["repeat"]) for r in runs] == order
  assert runs[0]["epoch_seconds"] == 2.0 and runs[0]["wall_seconds"] == 10.0 and runs[0]["other_cpu_share"] is None


def test_scaling_machine_load_is_the_cpu_share_other_processes_used():
  from benchmarks import scaling
  before = {"time": 0.0, "load": 0.5, "busy_cpu_seconds": 100.0, "own_cpu_seconds": 10.0}
  after = {"time": 10.0, "load": 2.5, "busy_cpu_seconds": 115.0, "own_cpu_seconds": 20.0}  # 15 busy, 10 ours
  load = scaling.machine_load(before, after, cores=2)
  assert load == {"wall_seconds": 10.0, "load_before": 0.5, "load_after": 2.5, "other_cpu_share": 0.25}


def test_scaling_spread_gives_median_min_max_and_inclusive_quartiles():
  from benchmarks import scaling
  assert scaling.spread([3.0, 1.0, 2.0, 10.0, 4.0]) == {
      "median": 3.0, "min": 1.0, "q1": 2.0, "q3": 4.0, "max": 10.0, "values": [3.0, 1.0, 2.0, 10.0, 4.0]}
  assert scaling.spread([5.0]) == {"median": 5.0, "min": 5.0, "q1": 5.0, "q3": 5.0, "max": 5.0, "values": [5.0]}


def test_scaling_speedup_is_the_median_of_pair_ratios_beside_the_ratio_of_medians():
  from benchmarks import scaling
  results = scaling.summarise(fake_runs(FAKE_SECONDS))
  workers = results["speedup"]["multi_worker"]
  assert workers["values"] == [2.0, 1.6, 2.2]  # 2.0/1.0, 4.0/2.5, 2.2/1.0: each round's pair
  assert workers["median"] == 2.0 and workers["min"] == 1.6 and workers["max"] == 2.2
  assert workers["ratio_of_medians"] == pytest.approx(2.2 / 1.0)  # a slow round shifts it, not the paired median
  assert workers["median_from_images_per_sec"] == pytest.approx(2.0)
  assert results["speedup_2_workers"] == 2.0 and results["efficiency_2_workers"] == 1.0
  assert results["efficiency"]["multi_worker"]["min"] == 0.8
  assert results["speedup_2_mirrored_replicas"] == pytest.approx(1.1)
  case = results["cases"][2]
  assert (case["setup"], case["replicas"], case["epoch_seconds"]["median"]) == ("multi_worker", 1, 2.2)
  assert case["epoch_seconds"]["values"] == [2.0, 4.0, 2.2]
  assert [(r["setup"], r["replicas"], r["speedup"]) for r in results["rows"]] == [
      ("mirrored", 1, 1.0), ("mirrored", 2, pytest.approx(1.1)), ("multi_worker", 1, 1.0), ("multi_worker", 2, 2.0)]


def test_scaling_csv_holds_each_statistic_and_every_repeat_per_case(tmp_path):
  from benchmarks import scaling
  results = scaling.summarise(fake_runs(FAKE_SECONDS))
  scaling.write_csv(scaling.csv_rows(results), tmp_path / "scaling.csv")
  rows = list(csv.DictReader(open(tmp_path / "scaling.csv")))
  workers2 = {r["statistic"]: r for r in rows if (r["setup"], r["replicas"]) == ("multi_worker", "2")}
  assert list(workers2) == ["median", "min", "q1", "q3", "max", "repeat_1", "repeat_2", "repeat_3"]
  assert float(workers2["median"]["speedup"]) == 2.0 and float(workers2["min"]["efficiency"]) == 0.8
  assert float(workers2["repeat_2"]["epoch_seconds"]) == 2.5 and float(workers2["repeat_2"]["speedup"]) == 1.6
  assert workers2["repeat_1"]["load_after"] == "2.0" and workers2["median"]["load_after"] == ""
  assert len(rows) == 4 * 8


def test_scaling_plot_writes_three_titled_pngs(tmp_path):
  from benchmarks import scaling
  results = scaling.summarise(fake_runs(FAKE_SECONDS))
  titles = scaling.plot(results, str(tmp_path), "configs/x.py, batch 64 per replica\n2 cores, Some CPU")
  assert set(titles) == {"epoch_time.png", "images_per_sec.png", "speedup.png"}
  for filename, title in titles.items():
    assert (tmp_path / filename).read_bytes()[:4] == b"\x89PNG"
    assert "batch 64" in title and "2 cores, Some CPU" in title


def test_scaling_machine_description_names_cores_and_cpu():
  from benchmarks import scaling
  machine = scaling.machine_description()
  assert machine["cores"] == os.cpu_count() and machine["cpu"]


def test_scaling_worker_cases_get_one_thread_each_unless_overridden():
  from benchmarks import scaling
  runner = scaling.CaseRunner("configs/digits_cnn.py", "/tmp/out", 3, ["inter_op_threads=2"], batch=64)
  runner.steps_per_loop = {1: 11, 2: 5}
  command = runner.command("multi_worker", 2, "/tmp/out/w")
  assert command[2:4] == ["launch.local", "--workers=2"]
  assert "--config.intra_op_threads=1" in command and "--config.inter_op_threads=2" in command
  assert "--config.inter_op_threads=1" not in command
  assert "--config.train.global_batch_size=128" in command and "--config.train.steps_per_loop=5" in command
  mirrored = runner.command("mirrored", 1, "/tmp/out/m")
  assert "--config.cpu_replicas=0" in mirrored and "--config.train.steps_per_loop=11" in mirrored


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


def test_ab_runs_this_checkouts_script_on_both_sides_and_reads_keys_holding_dots(tmp_path):
  """{head} is this checkout on both sides; a key naming a file (tests/x.py) is matched whole."""
  probe = ("import json, os, sys; json.dump({'files': {'tests/x.py': {'cpu': float(sys.argv[2] == sys.argv[3])}}}, "
           "open(sys.argv[1], 'w'))")
  result = run_module("benchmarks.ab", "--rounds=1", "--key=files.tests/x.py.cpu", "--base_args=x", "--head_args=y",
                      "--", "python", "-c", probe, "{out}", "{head}", REPO)
  summary = json.loads(result.stdout.strip().splitlines()[-1])["results"]["files.tests/x.py.cpu"]
  assert summary["base"] == [1.0] and summary["head"] == [1.0]
  from benchmarks import ab
  with pytest.raises(SystemExit, match="--key=files.tests/y.py.cpu: no 'tests/y.py.cpu' in the run's JSON"):
    ab.lookup({"files": {"tests/x.py": {"cpu": 1.0}}}, "files.tests/y.py.cpu")


def test_suite_measures_each_test_files_wall_and_cpu_with_its_processes_and_stops_on_a_failure(tmp_path):
  """benchmarks/suite.py in a folder of its own: a test whose child process burns CPU counts that CPU."""
  (tmp_path / "tests").mkdir()
  burn = "import time; end = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
  (tmp_path / "tests" / "test_burn.py").write_text(
      f"import subprocess, sys\n\ndef test_burn():\n  subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n")
  (tmp_path / "tests" / "test_fails.py").write_text("def test_fails():\n  raise AssertionError('on purpose')\n")
  script = os.path.join(REPO, "benchmarks", "suite.py")
  done = subprocess.run([sys.executable, script, "--out=out.json", "tests/test_burn.py"], cwd=tmp_path,
                        capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
  results = json.load(open(tmp_path / "out.json"))
  burned = results["files"]["tests/test_burn.py"]
  assert 0.6 <= burned["cpu"] <= burned["wall"] + 1.0 and results["total"] == burned
  failed = subprocess.run([sys.executable, script, "--out=again.json", "tests/test_burn.py", "tests/test_fails.py"],
                          cwd=tmp_path, capture_output=True, text=True)
  assert failed.returncode != 0 and "tests/test_fails.py failed in" in failed.stderr
  assert not (tmp_path / "again.json").exists()
  missing = subprocess.run([sys.executable, script, "--out=x.json", "tests/test_none.py"], cwd=tmp_path,
                           capture_output=True, text=True)
  assert missing.returncode != 0 and missing.stderr.strip().endswith(f"no such test file in {tmp_path}: "
                                                                     "tests/test_none.py")


def test_ab_compares_two_variants_of_the_working_tree_by_their_arguments():
  probe = "import json, sys; json.dump({'value': float(sys.argv[2])}, open(sys.argv[1], 'w'))"
  result = run_module("benchmarks.ab", "--rounds=2", "--key=value", "--base_args=2", "--head_args=3", "--", "python",
                      "-c", probe, "{out}")
  summary = json.loads(result.stdout.strip().splitlines()[-1])["results"]["value"]
  assert summary["base"] == [2.0, 2.0] and summary["head"] == [3.0, 3.0]
  assert summary["ratio_head_vs_base"] == 1.5


def test_scaling_ceiling_is_independent_runs_and_multi_worker_is_read_against_it_round_by_round():
  from benchmarks import scaling
  seconds = {("multi_worker", 1): [2.0, 4.0, 2.0], ("multi_worker", 2): [1.25, 2.5, 1.0],
             ("independent", 1): [2.0, 4.0, 2.0], ("independent", 2): [1.1, 2.0, 1.0]}
  results = scaling.summarise(fake_runs(seconds))
  assert results["efficiency"]["independent"]["values"] == pytest.approx([2.0 / 1.1 / 2, 1.0, 1.0])
  assert results["efficiency_ceiling_2_workers"] == pytest.approx(1.0)
  # per round, the unconnected pair's epoch time over the connected pair's (the 1-worker cases are the same)
  assert results["of_ceiling"]["values"] == pytest.approx([1.1 / 1.25, 0.8, 1.0])
  assert results["efficiency_2_workers_of_ceiling"] == pytest.approx(0.88)


def test_scaling_independent_pair_runs_two_unconnected_runs_at_once(tmp_path, monkeypatch):
  """Two fake runs: each writes its summary; they must overlap in time; the pair's epoch is their mean / 2."""
  import sys
  from benchmarks import scaling
  fake = ("import json, os, sys, time; w = sys.argv[1]; os.makedirs(w); started = time.time(); time.sleep(1.0); "
          "json.dump({'global_batch_size': 64, 'examples_per_sec': 100.0, 'mean_epoch_seconds_excluding_first': "
          "float(sys.argv[2]), 'started': started, 'ended': time.time()}, open(os.path.join(w, 'summary.json'), 'w'))")
  runner = scaling.CaseRunner("configs/digits_cnn.py", str(tmp_path), 3, [], 64)
  epoch = iter(["3.0", "5.0"])
  monkeypatch.setattr(runner, "command", lambda setup, replicas, workdir: [sys.executable, "-c", fake, workdir,
                                                                            next(epoch)])
  result = runner("independent", 2, 0)
  assert result["epoch_seconds"] == pytest.approx(2.0) and result["images_per_sec"] == 200.0
  assert result["global_batch_size"] == 128
  a, b = (json.load(open(tmp_path / "independent-2-r1" / name / "summary.json")) for name in ("a", "b"))
  assert a["started"] < b["ended"] and b["started"] < a["ended"]  # at once, not one after the other


@pytest.mark.e2e
def test_records_benchmark_smoke(tmp_path):
  """A tiny folder, prepared as JPEG and raw records; every contender timed in one run, the ratios computed from
  the rates it reports, and the bytes each of 2 workers reads counted."""
  out = tmp_path / "records.json"
  run_module("benchmarks.records", "--config=configs/digits_cnn.py", f"--folder={tmp_path / 'chips'}", "--make=160",
             "--size=48", "--image_size=16", "--windows=1", "--window_batches=2", "--config.train.global_batch_size=16",
             "--config.train.steps_per_loop=2", f"--out={out}")
  results = json.load(open(out))
  rates = {name: r["median"] for name, r in results["images_per_sec"].items()}
  assert set(rates) == {"folder", "jpeg_records", "raw_records", "jpeg_service", "raw_service", "train_jpeg_records",
                        "train_synthetic"} and all(r > 0 for r in rates.values())
  ratios = results["ratios"]
  assert ratios["jpeg_records_vs_folder"] == pytest.approx(rates["jpeg_records"] / rates["folder"])
  assert ratios["real_vs_synthetic"] == pytest.approx(rates["train_jpeg_records"] / rates["train_synthetic"])
  assert all(0.3 < share < 0.8 for share in ratios["bytes_read_per_worker_of_2"])
  manifest = json.load(open(tmp_path / "chips-raw" / "manifest.json"))
  assert manifest["image_shape"] == [16, 16, 3] and sum(manifest["splits"]["train"]["counts"]) == 160
