"""`main.py --check=workers` (loops/worker_check.py): one device against multi_worker_mirrored on 2 local worker
processes. The command-line runs and one shared worker pair train for real; the rest uses stand-in workers."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from errors import ConfigError
from loops import replica_check
from loops import rounding
from loops import worker_check
from tests.conftest import REPO, load_config, run_main, set_keys


@pytest.mark.e2e
def test_check_workers_from_the_command_line_passes_a_correct_task():
  result = run_main("--config=configs/tasks.py:regression", "--check=workers")
  assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
  last = result.stdout.strip().splitlines()[-1]
  assert last.startswith("workers: PASS: 1 device and 2 workers agree"), result.stdout[-2000:]


@pytest.mark.e2e
def test_check_workers_from_the_command_line_fails_a_replica_local_statistic_and_both_sides_stop_there():
  """A mistake at step 1 of a 20-step check: the one-device side stops LEAD steps after it, the workers before
  the step after that (their steps were 20 before)."""
  result = run_main("--config=configs/tasks.py:regression", "--check=workers", "--config.check.steps=20",
                    "--config.task.name=tests.fixtures.wrong_tasks:LocallyCentred")
  assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
  assert result.stdout.strip().splitlines()[-1].startswith("workers: FAIL: "), result.stdout[-2000:]
  taken = re.search(r"check: judged up to step (\d+) of 20: 1 device took (\d+) steps, the 2 workers (\d+)$",
                    result.stderr, re.M)
  assert taken, result.stderr[-3000:]
  first, one, workers = map(int, taken.groups())
  assert first == 1 and one == first + worker_check.LEAD and first <= workers <= one + 1, taken.group(0)


@pytest.mark.e2e
def test_a_task_raising_on_worker_1_is_one_line_naming_its_file_without_the_workers_traceback():
  result = run_main("--config=configs/tasks.py:regression", "--check=workers",
                    "--config.task.name=tests.fixtures.contract_tasks:RaisesOnWorker1")
  assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
  last = result.stderr.strip().splitlines()[-1]
  assert re.fullmatch(r"error: --check=workers: worker 1 failed \(exit code 1\): RuntimeError: worker 1 cannot read "
                      r"its shard \(in .*tests/fixtures/contract_tasks.py:\d+\)", last), result.stderr[-3000:]
  assert "Traceback" not in result.stderr and "[worker:1]" not in result.stderr, result.stderr[-3000:]


@pytest.mark.e2e
def test_a_step_beyond_the_one_devices_floor_is_taken_again_in_float64_by_both_workers(monkeypatch):
  """Every step made to exceed what the one device's own error explains (its margin 1e-3, not 10): both workers
  take it again in float64 on a float64 build of theirs, their float64 steps agree with one device's, and both
  sides' float32 errors summed explain the difference (ResNet-8 with synchronized BatchNorm needed it at step 3,
  with Grappler's constant folding on: 1.25e-3 apart where 1e-4 was explained)."""
  judged_rows = replica_check.step_rows

  def tight(step, start, one, two, floor, paths, precision=None, margin=rounding.MARGIN):
    return judged_rows(step, start, one, two, floor, paths, precision, 1e-3 if margin == rounding.MARGIN else margin)

  monkeypatch.setattr(replica_check, "step_rows", tight)
  config = set_keys(load_config("tasks", "regression"), {
      "task.name": "tests.fixtures.split_sensitive_tasks:WithDropout", "model.sync_batchnorm": True})
  (passed, lines), = worker_check.compare([config])
  assert passed and lines[-1].startswith("workers: PASS: 1 device and 2 workers agree on all "), lines
  said, = [line for line in lines if ": beyond that, so the two workers' side's own float32 error" in line]
  assert said.startswith("  steps 1, 2, 3: beyond that, "), said
  assert float(said.rsplit(" ", 1)[1]) < 1e-9, said  # float64 sides: measured 2.4e-15


def test_parameter_server_is_refused_in_one_line():
  config = load_config("tasks", "regression")
  config.strategy = "parameter_server"
  with pytest.raises(ConfigError, match=r"^--check=workers compares one device with multi_worker_mirrored "):
    worker_check.run(config)


def test_the_two_sides_train_the_same_batches_on_the_cpu():
  config = load_config("tasks", "regression")
  one, two = worker_check.one_device(config, 3), worker_check.two_workers(config, 3)
  assert (one.strategy, one.cpu_replicas, one.num_gpus) == ("one_device", 0, 0)
  assert (two.strategy, two.cpu_replicas, two.num_gpus) == ("multi_worker_mirrored", 0, None)
  for c in (one, two):
    assert c.deterministic and c.data.service == "" and c.seed == config.seed
    assert (c.train.steps, c.train.steps_per_loop, c.train.epochs) == (3, 3, None)
    assert c.train.global_batch_size == config.train.global_batch_size


def test_configs_of_the_same_strategy_settings_share_a_worker_pair():
  configs = [worker_check.two_workers(load_config(name, arg), 3)
             for name, arg in (("tasks", "regression"), ("digits_cnn", None), ("tasks", "regression"))]
  configs[1].model.name = "mnist_cnn"  # the model, data and task are each config's own
  assert worker_check.sharing_a_pair(configs) == [[0, 1, 2]]
  configs[1].cluster.bytes_per_pack = 1 << 20  # the strategy's communication options: a pair of its own
  assert worker_check.sharing_a_pair(configs) == [[0, 2], [1]]


def test_the_workers_get_the_configs_as_checked_here(tmp_path):
  config = load_config("tasks", "regression")  # eval.every_steps is a reference to train.steps // 2
  config.train.steps = 40
  config.model.kwargs = {"width": 3}  # a free key, as main.py's --config.model.kwargs.width=3 sets it
  worker_check.save_configs(str(tmp_path), [config])
  (loaded,) = worker_check.load_configs(str(tmp_path))
  assert loaded == config.copy_and_resolve_references()
  assert loaded.eval.every_steps == 20 and loaded.model.kwargs.width == 3


def test_states_round_trip_and_keys_only_one_side_has_differ_without_bound(tmp_path):
  states = [{("model model", 0): np.full((2, 3), k, np.float32), ("optimizer model", 1): np.full(3, 2.0 * k)}
            for k in range(3)]
  for k, state in enumerate(states):
    path = worker_check.starts_path(str(tmp_path), 0, k)
    worker_check.save_state(path, state)
    back = worker_check.load_state(path)
    assert set(back) == set(state) and not os.path.exists(path + ".partial")
    for key, value in state.items():
      assert np.array_equal(back[key], value) and back[key].dtype == value.dtype
  one = [(states[k], states[k + 1]) for k in range(2)]
  paths = {("model model", 0): "model model: d/kernel", ("optimizer model", 1): "optimizer model: adam/m"}
  verdict = replica_check.judged(one, [states[1], states[2]], one, paths)
  assert verdict.passed and {row.difference for row in verdict.rows} == {0.0}
  fewer = [{key: value for key, value in state.items() if key[0] == "model model"} for state in states[1:]]
  verdict = replica_check.judged(one, fewer, one, paths)
  assert [(row.step, row.path) for row in verdict.beyond] == [(1, "optimizer model: adam/m (only on one side)"),
                                                                (2, "optimizer model: adam/m (only on one side)")]


def written_steps(directory, apart, float64_apart=None):
  """Three steps' files of config 0: the one-device side's states (each step adds 1 to a kernel of 4), the workers'
  finals `apart` from step 2 on, their float64 finals `float64_apart` (None: none written; "error": the float64
  step failed); returns the starts."""
  starts = [{("model model", 0): np.full(4, float(k), np.float32)} for k in range(4)]
  for k, state in enumerate(starts):
    worker_check.save_state(worker_check.starts_path(directory, 0, k), state)
  for k in range(3):
    final = starts[k + 1][("model model", 0)] + (apart if k >= 1 else 0.0)
    worker_check.save_state(worker_check.values_path(directory, 0, k), {("model model", 0): final})
    if float64_apart == "error":
      answer = {worker_check.ERROR: np.array("TypeError: a float32 constant")}
    else:
      answer = {("model model", 0): starts[k + 1][("model model", 0)] + (float64_apart or 0.0)}
    if float64_apart is not None:
      worker_check.save_state(worker_check.above_path(directory, 0, k), answer)
  return starts


def judged_files(directory, starts, monkeypatch):
  """worker_check.judged of written_steps' files; the floor run (a real build) stands in as the one-device side
  itself moved by 1e-6 of its update: rounding explains 1e-5 (the least difference judged)."""
  built = replica_check.Built({("model model", 0): "model model: kernel"}, replica_check.Suspects(), {})
  def floor_step(self, k, start):
    self.how = replica_check.Floor("float64")
    return start, {key: value * (1 + 1e-6) for key, value in starts[k + 1].items()}

  monkeypatch.setattr(replica_check.FloorRun, "step", floor_step)
  return worker_check.judged(directory, 0, load_config("digits_cnn"), 3, built)


def test_the_workers_state_files_are_judged_one_step_at_a_time(tmp_path, monkeypatch):
  """worker_check.judged reads the one-device side's states and the workers' finals step by step; a difference
  from step 2 on, which the workers' float64 steps show too, is the first step that differs: asked of them there,
  beyond the one-device side's floor, and the judging stops (step 3 is neither read nor asked, as --check=replicas
  stops at its first differing step)."""
  starts = written_steps(str(tmp_path), 0.5, float64_apart=0.5)
  os.remove(worker_check.values_path(str(tmp_path), 0, 2))  # step 3's final: not needed
  comparison = judged_files(str(tmp_path), starts, monkeypatch)
  assert comparison.verdict.first_step == 2 and comparison.first[0] == 2
  assert [row.step for row in comparison.verdict.beyond] == [2]
  assert sorted(os.listdir(tmp_path)) == sorted(
      [f"starts-0-{k}.npz" for k in range(4)] + [f"values-0-{k}.npz" for k in range(2)]
      + [f"above-values-0-{k}.npz" for k in range(3)] + ["above-request-0-1.npz"])
  assert [step for step, _ in comparison.both] == [2]
  assert comparison.both[0][1] == pytest.approx(0.5, rel=1e-3)  # their float64 steps as far apart


def test_a_step_only_the_workers_float32_error_explains_passes_and_is_said(tmp_path, monkeypatch):
  """The workers' finals 2e-3 of the update apart from step 2 on, beyond 10x the one-device side's floor; their
  float64 steps agree with the one device's: their own float32 error explains it (--check=replicas' rule)."""
  starts = written_steps(str(tmp_path), 2e-3 * 1.5, float64_apart=0.0)
  comparison = judged_files(str(tmp_path), starts, monkeypatch)
  assert comparison.verdict.passed and [step for step, _ in comparison.both] == [2, 3], comparison.verdict.beyond
  passed, lines = replica_check.report(comparison.verdict, 3, kind="workers", both=comparison.both)
  assert passed and lines[-2].startswith("  steps 2, 3: beyond that, so the two workers' side's own float32 error "
                                         "was measured too (its step again in float64) and both sides' summed, x2; "
                                         "their float64 steps differ by at most "), lines
  assert max(value for _, value in comparison.both) < 1e-5  # the floor's own 1e-6 moves


def test_a_float64_step_the_workers_cannot_take_is_said_and_judged_on_the_one_device_floor(tmp_path, monkeypatch):
  starts = written_steps(str(tmp_path), 2e-3 * 1.5, float64_apart="error")
  comparison = judged_files(str(tmp_path), starts, monkeypatch)
  assert comparison.verdict.first_step == 2 and comparison.unmeasured == "TypeError: a float32 constant"
  assert "above-request-0-2.npz" not in os.listdir(tmp_path)  # asked once
  _, lines = replica_check.report(comparison.verdict, 3, kind="workers", unmeasured=comparison.unmeasured)
  assert lines[-2] == ("  the two workers' side's own float32 error could not be measured (its step does not run "
                       "in float64 on 2 workers: TypeError: a float32 constant): judged against the one-device "
                       "side's alone"), lines


def test_a_worker_answers_each_float64_request_in_order_until_the_config_is_judged(tmp_path):
  directory = str(tmp_path)
  for k in (1, 4):
    worker_check.save_state(worker_check.request_path(directory, 0, k), {})
  worker_check.save_state(worker_check.request_path(directory, 1, 0), {})  # another config's
  assert worker_check.next_request(directory, 0, -1) == 1
  assert worker_check.next_request(directory, 0, 1) == 4
  worker_check.save_state(worker_check.starts_path(directory, 0, 2), {})
  assert worker_check.next_event(directory, 0, 2, -1) == "above 1"  # a request before the step
  assert worker_check.next_event(directory, 0, 2, 4) == ""  # answered: step 2's start is written
  worker_check.save_state(worker_check.judged_path(directory, 0), {})
  assert worker_check.next_request(directory, 0, 4) is None
  assert worker_check.next_event(directory, 0, 2, 4) == worker_check.JUDGED


def test_worker_env_keeps_the_users_and_sets_the_checks():
  env = worker_check.worker_env({"TF_CONFIG": "{}", "PYTHONPATH": "/mine", "TF_CPP_MIN_LOG_LEVEL": "0", "A": "1"})
  assert "TF_CONFIG" not in env and env["A"] == "1" and env["TF_CPP_MIN_LOG_LEVEL"] == "0"
  assert env["PYTHONPATH"] == os.pathsep.join([REPO, "/mine"]) and env["CUDA_VISIBLE_DEVICES"] == "-1"
  assert worker_check.worker_env({})["PYTHONPATH"] == REPO
  assert worker_check.worker_command("/d", 7)[1:] == ["-m", "loops.worker_check", "/d", "7"]


def stand_in(monkeypatch, code):
  """Workers that run `code` (argv: DIRECTORY PARENT_PID) instead of training."""
  monkeypatch.setattr(worker_check, "worker_command",
                      lambda directory, pid: [sys.executable, "-c", textwrap.dedent(code), directory, str(pid)])


def test_a_failed_worker_is_named_with_its_last_line_and_the_other_is_stopped(monkeypatch, capsys, tmp_path):
  stand_in(monkeypatch, """
      import json, os, sys, time
      if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
        print("ValueError: something in the task", flush=True)
        sys.exit(3)
      time.sleep(60)""")
  started = time.monotonic()
  with pytest.raises(ConfigError, match=r"^--check=workers: worker 1 failed \(exit code 3\): ValueError: something"):
    worker_check.alongside_workers(str(tmp_path), [], lambda workers: None, timeout_seconds=60)
  assert time.monotonic() - started < 20
  assert "[worker:1] ValueError: something in the task" in capsys.readouterr().err


def test_workers_past_the_timeout_are_stopped_with_one_line(monkeypatch, tmp_path):
  stand_in(monkeypatch, "import time; time.sleep(60)")
  with pytest.raises(ConfigError, match=r"^--check=workers: the 2 workers did not end within 1 s \(stopped\)"):
    worker_check.alongside_workers(str(tmp_path), [], lambda workers: None, timeout_seconds=1)


def test_workers_that_do_not_write_a_final_in_time_are_stopped_with_one_line(monkeypatch, tmp_path):
  stand_in(monkeypatch, "import time; time.sleep(60)")
  wait = lambda workers: workers.waited_for(worker_check.values_path(workers.directory, 0, 2), "take step 3")
  with pytest.raises(ConfigError, match=r"^--check=workers: the 2 workers did not take step 3 within 1 s \(stopped\)"):
    worker_check.alongside_workers(str(tmp_path), [], wait, timeout_seconds=1)


def test_a_taken_port_starts_the_workers_once_more(monkeypatch, tmp_path):
  stand_in(monkeypatch, f"""
      import json, os, sys
      if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        with open(os.path.join({str(tmp_path)!r}, "starts"), "a") as f:
          f.write("x")
        if not os.path.exists(os.path.join({str(tmp_path)!r}, "failed")):
          open(os.path.join({str(tmp_path)!r}, "failed"), "w").close()
          sys.exit("error: port 1 of worker 0 (127.0.0.1:1) is in use by another process")""")
  assert worker_check.alongside_workers(str(tmp_path), [], lambda workers: "done") == "done"
  assert open(tmp_path / "starts").read() == "xx"  # worker 0 started twice


@pytest.mark.e2e
def test_sigterm_of_the_checking_process_stops_its_workers(tmp_path):
  script = textwrap.dedent(f"""
      import os, sys, tempfile, time
      from loops import worker_check
      code = "import os, sys, time; open(os.path.join({str(tmp_path)!r}, str(os.getpid())), 'w'); time.sleep(120)"
      worker_check.worker_command = lambda directory, pid: [sys.executable, "-c", code]
      worker_check.alongside_workers(tempfile.mkdtemp(), [], lambda workers: time.sleep(120))""")
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 60
  while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
  pids = [int(name) for name in os.listdir(tmp_path)]
  assert len(pids) == 2, proc.stderr.read() if proc.poll() is not None else "no workers within 60 s"
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=30) == 143
  assert "terminated (SIGTERM); its worker processes are stopped" in proc.stderr.read()
  for pid in pids:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
