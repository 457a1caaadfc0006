"""`main.py --check=workers`: does this task and config compute on 2 worker processes what it computes on one device?

The proof of `--check=replicas` (loops/replica_check.py: op determinism, a few steps each taken from the same weights,
every model and optimizer variable's one-step update judged against what rounding explains, the verdict last)
across processes: one
device in this process against multi_worker_mirrored on 2 worker processes on this machine (TF_CONFIG on loopback
ports, started by launch/local.py; one CPU replica each, GPUs hidden from them, so the one-device side runs on the
CPU too), as users run several workers. What it adds to the replica check: the cross-worker reductions, each
worker's own input shard, a state kept per process.

This process writes the workers' configs (the resolved variants themselves, pickled: the workers train exactly what
was checked here, command-line overrides included) to a private temporary directory and runs the one-device side
while they start and build; it writes the start of each of its steps there, the workers take each step from it, and
the chief writes their finals there, judged here as they come (the one-device side at most LEAD steps ahead of the
judging). A step beyond the one-device side's own float32 error (every step of a float16 or bfloat16 config) is
asked of the workers once more in the precision above (float64; float32 for a float16 or bfloat16 config: a request
file, answered before their next step; the chief writes that final too: their own rounding error, as
--check=replicas measures the two replicas'); a marker tells them a config is judged. At its first differing step
both sides stop: nothing later is taken, compared or asked (the workers agree before each step on what they do).
Each wait for the workers (a step's final, its final in the precision above, their end) is bounded by `timeout_seconds`; they end
with this process (their process group is stopped on every way out, SIGTERM included; a SIGKILL of this process
reaches them through the kernel's parent-death signal on Linux).

Worker side (hidden): `python -m loops.worker_check DIRECTORY PARENT_PID`, with TF_CONFIG set.
"""

import collections
import contextlib
import functools
import gc
import io
import json
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

from absl import logging
import numpy as np
import tensorflow as tf

from configs import settings as settings_lib
from errors import ConfigError, first_line
from launch import local
from loops import build as build_lib
from loops import rules as rules_lib
from loops import first_difference
from loops import replica_check
from loops.distribute import rules as distribute_rules
from loops.distribute import cluster
from loops.distribute import startup
from loops.distribute import strategy as strategy_lib

WORKERS = 2
TIMEOUT_SECONDS = 600.0  # each wait for both workers: a step's final (the first: TensorFlow's start and build), their end
ATTEMPTS = 2  # a worker whose port was taken between choosing it and binding it (the free-port race): once more
PORT_TAKEN = re.compile(r"is in use by another process|Address already in use|Could not start gRPC server")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = "configs.pkl"
SHOWN_LINES = 20  # a failed worker's last output lines, printed to stderr
POLL_SECONDS = 0.1
LEAD = 2  # steps the one-device side takes ahead of the judging: both sides stop within it of a differing step
JUDGED, ABOVE = "judged", "above "  # what the workers agree to do before a step, besides taking it
ERROR = ("error", 0)  # the key of a final in the precision above that could not be taken: its error's first line


def run(config, steps=None, out=print, timeout_seconds=TIMEOUT_SECONDS):
  """Runs both sides and prints the report (verdict last); returns True when they agree.

  Raises:
    ConfigError: strategy=parameter_server (asynchronous: its updates are not those of one device), a setting the
      check cannot run, or a worker that failed or did not end in time (its last lines printed to stderr first).
  """
  build_lib.logged_config(config)
  (passed, lines), = compare([config], steps, timeout_seconds)
  out(replica_check.settings_line(config, "workers", WORKERS))
  for line in lines:
    out(line)
  return passed


def compare(configs, steps=None, timeout_seconds=TIMEOUT_SECONDS):
  """[(passed, report lines)] of each config: its one-device side in this process while a pair of worker processes
  trains it. Configs of the same strategy settings share one pair (each TensorFlow start costs seconds): each worker
  starts its multi-worker strategy once and trains them in turn on it (a second strategy in one process would
  re-enable its collective ops while its peer may already call on them: 'Socket closed' in CompleteGroup, measured
  under load). Every config is checked before any worker starts. steps: default replica_check.steps_for(config);
  timeout_seconds: per wait for the workers (Workers)."""
  for config in configs:
    refuse_asynchronous(config)
  counts = [steps or replica_check.steps_for(config) for config in configs]
  # where a FAIL is located
  strategy_lib.configure_devices(settings_lib.read(replica_check.variant(configs[0], 2, counts[0])).run)
  ones = [one_device(config, n) for config, n in zip(configs, counts)]
  twos = [two_workers(config, n) for config, n in zip(configs, counts)]
  for config in ones + twos:
    rules_lib.check(config)  # a setting it refuses: one line, before any worker starts
  for config in twos:
    replica_check.check_split(config, "workers")
    distribute_rules.check_micro_batches_across_workers(config, WORKERS)
  reports = [None] * len(configs)
  for pair in sharing_a_pair(twos):
    directory = tempfile.mkdtemp(prefix="worker_check-")
    try:
      with build_lib.determinism_restored():
        comparisons = alongside_workers(directory, [twos[n] for n in pair],
                                        functools.partial(check_each, ones, counts, pair), timeout_seconds)
        for i, (n, comparison) in enumerate(zip(pair, comparisons)):
          if not comparison.verdict.passed:
            logging.info("check: judged up to step %d of %d: 1 device took %d steps, the %d workers %d",
                         comparison.verdict.first_step, counts[n], steps_taken(starts_path, directory, i) - 1,
                         WORKERS, steps_taken(values_path, directory, i))
          reports[n] = _report(comparison, configs[n], counts[n])
    finally:
      shutil.rmtree(directory, ignore_errors=True)
  return reports


def check_each(configs, counts, indices, workers):
  """[replica_check.Comparison] of each indexed config in turn: its one-device side trained in this process (each
  state written to the workers' directory as it goes: they take each step from it), at most LEAD steps ahead of
  the judging of the workers' finals as they come; up to the first step that differs, then marked judged (the
  workers stop there and go on to the next)."""
  comparisons = []
  for i, n in enumerate(indices):
    side = replica_check.Side(configs[n])
    save_state(starts_path(workers.directory, i, 0), side.state())
    judging = None
    for k in range(counts[n]):
      save_state(starts_path(workers.directory, i, k + 1), side.step()[1])
      judging = judging or Judging(workers.directory, i, configs[n], counts[n], side.built(), workers.waited_for)
      if judging.up_to(k + 1 - LEAD):
        break
    comparisons.append(judging.comparison())
    save_state(judged_path(workers.directory, i), {})
  return comparisons


def steps_taken(path_of, directory, i):
  """How many files path_of (starts_path: one more than the one-device side's steps; values_path: the workers'
  steps) names for the i-th config of `directory`."""
  return len(tf.io.gfile.glob(path_of(directory, i, "*")))


def from_the_files(path, doing):
  """load_state(path): a file already written (judged's default)."""
  del doing
  return load_state(path)


def judged(directory, i, one_config, steps, built, waited_for=from_the_files):
  """The replica_check.Comparison of the i-th config of `directory` (Judging), every step's files written."""
  return Judging(directory, i, one_config, steps, built, waited_for).comparison()


class Judging:
  """The i-th config of `directory` judged one step at a time: the one-device side's states and the workers' finals
  as waited_for(path, doing) gives them, their finals in the precision above asked of them where a step needs it
  (WorkersFloor); up to the first step where a variable differs, as --check=replicas (nothing later is asked)."""

  def __init__(self, directory, i, one_config, steps, built, waited_for=from_the_files):
    self.directory, self.i, self.steps, self.built, self.waited_for = directory, i, steps, built, waited_for
    self.judge = replica_check.Judge(one_config, built.paths, pools=built.pools,
                                     other=WorkersFloor(directory, i, waited_for))
    self.progress = replica_check.StepsJudged(steps)
    self.k, self.start = 0, None  # the next step to judge, its start

  def up_to(self, count):
    """Judges the steps before step `count` (0-based) not judged yet; True once one differs (none later is)."""
    while self.k < min(count, self.steps) and not self.judge.first:
      k = self.k
      start = self.start if k else load_state(starts_path(self.directory, self.i, 0))
      final = load_state(starts_path(self.directory, self.i, k + 1))
      self.judge.step(k, start, final, self.waited_for(values_path(self.directory, self.i, k), f"take step {k + 1}"))
      if not self.judge.first:
        self.progress.judged(k)
      self.k, self.start = k + 1, final
    return bool(self.judge.first)

  def comparison(self):
    """The replica_check.Comparison, every step judged up to the first that differs."""
    self.up_to(self.steps)
    return self.judge.comparison(self.built)


class WorkersFloor:
  """The two workers' own rounding error (replica_check.OtherFloor across processes): asked for a step, they take it
  again in the precision above (replica_check.HIGHER) from the same start and the chief writes that final; None where
  it does not run in it."""

  def __init__(self, directory, n, waited_for):
    self.directory, self.n, self.waited_for, self.why_not = directory, n, waited_for, ""

  def step(self, k, start):
    """(start, final) of step k (0-based) from `start` in the precision above on the workers, or None."""
    if self.why_not:
      return None
    save_state(request_path(self.directory, self.n, k), {})
    final = self.waited_for(above_path(self.directory, self.n, k), f"take step {k + 1} again in the precision above")
    if ERROR in final:
      self.why_not = str(final[ERROR])
      return None
    return start, final


def sharing_a_pair(twos):
  """The indices of the configs each worker pair trains, in order: those whose strategy settings (strategy,
  cluster.*, devices) are the same."""
  pairs = {}
  for n, config in enumerate(twos):
    settings = (config.strategy, config.cpu_replicas, config.num_gpus,
                json.dumps(config.cluster.to_dict(), sort_keys=True, default=str))
    pairs.setdefault(settings, []).append(n)
  return list(pairs.values())


def _report(comparison, config, steps):
  """The replica check's report for the workers. A FAIL names inf or NaN on a side first; else where the sides
  part, located on 2 replicas of this process (the step's causes are the same; a difference that only workers
  show, such as what each reads, is then said to be one)."""
  cause = replica_check.REDUCTION
  if not comparison.verdict.passed:
    sides = replica_check.non_finite_at(comparison)
    cause = replica_check.non_finite_cause(sides, kind="workers") or located(comparison, config, steps)
  return replica_check.report(comparison.verdict, steps, kind="workers", cause=cause, floor=comparison.how,
                              precision=config.mixed_precision, tied=comparison.tied, both=comparison.both,
                              unmeasured=comparison.unmeasured, in_float32=comparison.in_float32,
                              skipped=comparison.skipped)


def located(comparison, config, steps):
  """replica_check's cause of the FAIL, from 2 replicas of this process (its logical CPUs: set up in compare)."""
  if len(tf.config.list_logical_devices("CPU")) < 2 and len(tf.config.list_logical_devices("GPU")) < 2:
    return replica_check.diagnose(comparison.built.suspects)
  finding, task = replica_check.locate(config, steps, comparison)
  if finding.kind == "gradients" and not comparison.built.suspects.clipping:
    return (f"on 2 replicas of this process every layer's output and the loss agree with one device at step "
            f"{comparison.verdict.first_step}: the gradients are changed before the cross-replica sum, or the "
            f"difference comes from the workers themselves (what each reads, a state kept per process)")
  return "on 2 replicas of this process: " + replica_check.named_cause(
      finding, first_difference.described(finding, task, config.loss.name, config.task.name,
                                           comparison.verdict.first_step),
      comparison.built.suspects, replica_check.confirmed_without(config, steps, comparison.verdict.first_step),
      comparison.verdict.first_step)


def refuse_asynchronous(config):
  """ConfigError for strategy=parameter_server: the check proves synchronous training only."""
  if config.strategy == "parameter_server":
    raise ConfigError("--check=workers compares one device with multi_worker_mirrored (synchronous updates); "
                      "parameter_server applies each worker's update on its own, so no run of it equals one device: "
                      "check the task with --config.strategy=multi_worker_mirrored (or --check=replicas)")


def one_device(config, steps):
  """The replica check's one-replica variant on the CPU (the workers' device): cpu_replicas=0 (this process's
  logical devices stay as they are) and num_gpus=0."""
  c = replica_check.variant(config, 1, steps)
  c.cpu_replicas, c.num_gpus = 0, 0
  return c


def two_workers(config, steps):
  """What each worker trains: multi_worker_mirrored, one CPU replica per worker, the same seed and batches."""
  c = replica_check.variant(config, 1, steps)
  c.strategy, c.cpu_replicas, c.num_gpus = "multi_worker_mirrored", 0, None
  return c


def alongside_workers(directory, configs, work, timeout_seconds=TIMEOUT_SECONDS):
  """work(Workers), while 2 worker processes train `configs` in turn on one strategy (each config resolved,
  multi_worker_mirrored, train.steps the steps; their strategy settings alike: see compare), each step from the start
  `work` writes to `directory` (starts_path), the chief writing its finals there (values_path) and those of each
  step it asks for (request_path) again in the precision above (above_path), until `work` marks the config judged
  (judged_path)."""
  workers = Workers(directory, timeout_seconds)
  save_configs(directory, configs)
  with stopped_by_sigterm():
    workers.start()
    try:
      result = work(workers)
      workers.finish()
    finally:
      workers.stop()
  return result


class Tail:
  """The last lines written to it (launch.local's output pumps write each process's lines, prefixed)."""

  def __init__(self, size=200):
    self.lines = collections.deque(maxlen=size)

  def write(self, text):
    self.lines.extend(text.splitlines())

  def flush(self):
    pass

  def of(self, name):
    prefix = f"[{name}] "
    return [line[len(prefix):] for line in self.lines if line.startswith(prefix)]


class Workers:
  """The worker processes of one check, started by launch/local.py in their own process groups."""

  def __init__(self, directory, timeout_seconds=TIMEOUT_SECONDS, count=WORKERS):
    self.directory, self.timeout_seconds, self.count = directory, timeout_seconds, count
    self.procs, self.pumps, self.output, self.attempts = {}, [], Tail(), 1

  def start(self):
    spec = local.cluster_spec(self.count)
    command = worker_command(self.directory, os.getpid())
    self.procs, self.pumps = local._start_processes(command, spec, local.processes_of(spec), worker_env(os.environ),
                                                self.output, threading.Lock())

  def finish(self):
    """Waits for both to end with 0 within the timeout (ConfigError otherwise: ended)."""
    deadline = time.monotonic() + self.timeout_seconds
    while not self.ended(deadline, "end"):
      time.sleep(POLL_SECONDS)

  def waited_for(self, path, doing):
    """load_state(path) once the chief has written it, within the timeout; ConfigError when a worker failed or the
    time ran out (`doing`: what they did not do in time)."""
    deadline = time.monotonic() + self.timeout_seconds
    while not tf.io.gfile.exists(path):
      if self.ended(deadline, doing):
        raise ConfigError(f"--check=workers: the {self.count} workers ended without doing it: {doing}")
      time.sleep(POLL_SECONDS)
    return load_state(path)

  def ended(self, deadline, doing):
    """True once both ended with 0, False while they run; ConfigError when one failed (both started once more
    first when a port was taken: they redo their work from the directory) or past the deadline."""
    failed, code = polled(self.procs, deadline)
    if failed is None:
      return code == 0
    self.stop()
    if code is None or self.attempts >= ATTEMPTS or not PORT_TAKEN.search("\n".join(self.output.lines)):
      raise self.failure(failed, code, doing)
    self.attempts += 1
    self.output = Tail()
    self.start()
    return False

  def failure(self, name, code, doing):
    """ConfigError naming the worker and its last line; its last lines (every worker's past the timeout, or a
    failed one's that did not end with its one error line) go to stderr first."""
    lines = [line for line in self.output.of(name) if line.strip()]
    said = code is not None and lines and lines[-1].startswith("error: ")
    for shown in (self.procs if code is None else [] if said else [name]):
      for line in [line for line in self.output.of(shown) if line.strip()][-SHOWN_LINES:]:
        print(f"[{shown}] {line}", file=sys.stderr)
    if code is None:
      return ConfigError(f"--check=workers: the {self.count} workers did not {doing} within "
                         f"{self.timeout_seconds:g} s (stopped); their last lines are above")
    last = lines[-1].strip().removeprefix("error: ") if lines else "no output"
    return ConfigError(f"--check=workers: {name.replace(':', ' ')} failed (exit code {code}): {last}")

  def stop(self):
    for proc in self.procs.values():
      local._stop(proc)
    for pump in self.pumps:
      pump.join(timeout=5)


def polled(procs, deadline):
  """(None, 0) once every process ended with 0, (None, None) while they run; (name, code) of the first that did
  not; (name, None) past the deadline (a process still running)."""
  codes = {name: proc.poll() for name, proc in procs.items()}
  failed = [name for name, code in codes.items() if code not in (None, 0)]
  if failed:
    first = next((name for name in failed if codes[name] < 0), failed[0])  # killed by a signal: the cause
    return first, codes[first]
  if all(code == 0 for code in codes.values()):
    return None, 0
  if time.monotonic() > deadline:
    return next(name for name, code in codes.items() if code is None), None
  return None, None


def worker_command(directory, parent_pid):
  """The hidden worker entry: the same interpreter, `-m loops.worker_check DIRECTORY PARENT_PID`."""
  return [sys.executable, "-m", "loops.worker_check", directory, str(parent_pid)]


def worker_env(environ):
  """The workers' environment: this one, without TF_CONFIG (launch.local sets each one's), GPUs hidden (one CPU
  replica each), the repository importable (`-m loops.worker_check` from the current directory), TensorFlow's
  C++ INFO and WARNING lines off unless set."""
  env = {key: value for key, value in environ.items() if key != "TF_CONFIG"}
  env["CUDA_VISIBLE_DEVICES"] = "-1"
  env["PYTHONPATH"] = os.pathsep.join([REPO] + ([environ["PYTHONPATH"]] if environ.get("PYTHONPATH") else []))
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return env


@contextlib.contextmanager
def stopped_by_sigterm():
  """SIGTERM ends this process through Python (exit 143), so that the workers are stopped on the way out."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def terminate(signum, frame):
    print("--check=workers: terminated (SIGTERM); its worker processes are stopped", file=sys.stderr)
    raise SystemExit(128 + signum)

  previous = signal.signal(signal.SIGTERM, terminate)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def save_configs(directory, configs):
  """The workers' configs, resolved (references replaced by their values), pickled as one list."""
  with tf.io.gfile.GFile(os.path.join(directory, CONFIGS), "wb") as f:
    f.write(pickle.dumps([c.copy_and_resolve_references() for c in configs]))


def load_configs(directory):
  """What save_configs wrote."""
  with tf.io.gfile.GFile(os.path.join(directory, CONFIGS), "rb") as f:
    return pickle.loads(f.read())


def values_path(directory, n, step):
  """Where the chief writes config n's final of a step (0-based)."""
  return os.path.join(directory, f"values-{n}-{step}.npz")


def starts_path(directory, n, step):
  """Where this process writes config n's state before a step (0-based; after the last: step = steps)."""
  return os.path.join(directory, f"starts-{n}-{step}.npz")


def request_path(directory, n, step):
  """Where this process asks the workers to take config n's step (0-based) again in the precision above."""
  return os.path.join(directory, f"above-request-{n}-{step}.npz")


def above_path(directory, n, step):
  """Where the chief writes config n's final of that step in the precision above (or the ERROR it met)."""
  return os.path.join(directory, f"above-values-{n}-{step}.npz")


def judged_path(directory, n):
  """Written once this process has judged config n: the workers go on to the next."""
  return os.path.join(directory, f"judged-{n}.npz")


def save_state(path, state):
  """{(owner, index): array} as one .npz (keys as JSON), written whole then renamed."""
  keys = sorted(state)
  arrays = {"keys": np.array(json.dumps(keys)), **{str(n): state[key] for n, key in enumerate(keys)}}
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  with tf.io.gfile.GFile(path + ".partial", "wb") as f:
    f.write(buffer.getvalue())
  tf.io.gfile.rename(path + ".partial", path, overwrite=True)


def load_state(path):
  """What save_state wrote."""
  with tf.io.gfile.GFile(path, "rb") as f:
    arrays = np.load(io.BytesIO(f.read()), allow_pickle=False)
    return {tuple(key): arrays[str(n)] for n, key in enumerate(json.loads(str(arrays["keys"])))}


def waited_for(path):
  """load_state(path) once the checking process has written it (it bounds the wait: it stops the workers at its
  deadline, and they die with it)."""
  while not tf.io.gfile.exists(path):
    time.sleep(POLL_SECONDS)
  return load_state(path)


def first_request(directory, n, after):
  """The first step after `after` that the checking process asks again in the precision above (request_path), or
  None."""
  pattern = re.compile(rf"above-request-{n}-(\d+)\.npz$")
  later = [int(m.group(1)) for m in map(pattern.match, tf.io.gfile.listdir(directory)) if m and int(m.group(1)) > after]
  return min(later, default=None)


def next_request(directory, n, after):
  """first_request once there is one, or None once the checking process has judged config n (it asks one step at a
  time and marks it judged only after the last answer)."""
  while True:
    asked = first_request(directory, n, after)
    if asked is not None:
      return asked
    if tf.io.gfile.exists(judged_path(directory, n)):
      return None
    time.sleep(POLL_SECONDS)


def die_with_parent(parent_pid, directory):
  """This worker is killed when the check's process ends, however it ends (Linux' PR_SET_PDEATHSIG); when that
  process is already gone (killed while TensorFlow was imported here), removes its directory and exits."""
  if not local.die_with_parent(parent_pid, signal.SIGKILL):
    shutil.rmtree(directory, ignore_errors=True)
    sys.exit("--check=workers: the checking process is gone")


def worker_main(argv):
  """The worker side: trains each config of DIRECTORY in turn on the strategy started for the first, each step
  from the start the checking process wrote (the chief writes each final there), answering its requests for a step
  in the precision above as they come, until it has judged the config (at a differing step: they stop there)."""
  directory, parent_pid = argv[1], int(argv[2])
  die_with_parent(parent_pid, directory)
  role = cluster.from_environment(source="tf_config")
  startup.check_port_free(role)
  strategy = None
  for n, config in enumerate(load_configs(directory)):
    rules_lib.check_role(config, role)
    if strategy is None:
      first = settings_lib.read(config)
      strategy_lib.configure_devices(first.run)
      strategy = build_lib.start_strategy(first.run, first.cluster, role)
    side = replica_check.Side(config, role=role, strategy=strategy)
    above = Above(directory, n, config, role, strategy)
    k = 0
    while k < config.train.steps:
      # every worker does the same next: the step, a step asked in the precision above, or stop (one all-reduce)
      event = side.execution.agree_on_stop(next_event(directory, n, k, above.answered)) if k else ""
      if event == JUDGED:
        break
      if event:
        above.answer(int(event.removeprefix(ABOVE)))
        continue
      _, final = side.step(waited_for(starts_path(directory, n, k)))
      if role.is_chief:
        save_state(values_path(directory, n, k), final)
      k += 1
    while (asked := next_request(directory, n, above.answered)) is not None:
      above.answer(asked)


def next_event(directory, n, k, answered):
  """What this worker sees before config n's step k (0-based), once it sees one: JUDGED (the checking process has
  judged the config), ABOVE + the first step after `answered` it asks again in the precision above, or "" (step
  k's start is written). The checking process writes one at a time (a request, then nothing until it is answered):
  the workers, each agreeing to the first that one saw, do the same."""
  while True:
    if tf.io.gfile.exists(judged_path(directory, n)):
      return JUDGED
    asked = first_request(directory, n, answered)
    if asked is not None:
      return f"{ABOVE}{asked}"
    if tf.io.gfile.exists(starts_path(directory, n, k)):
      return ""
    time.sleep(POLL_SECONDS)


class Above:
  """Config n's steps the checking process asks again in the precision above, each taken from its start on such a
  build of it (replica_check.OtherFloor's, on this strategy; made at the first); the chief writes each final, or
  the first line of what made that step fail (then every later request gets it too)."""

  def __init__(self, directory, n, config, role, strategy):
    self.directory, self.n, self.config, self.role, self.strategy = directory, n, config, role, strategy
    self.side, self.why_not, self.answered = None, "", -1

  def answer(self, k):
    if not self.why_not:
      try:
        if self.side is None:
          with replica_check.higher_precision(self.config) as above:
            self.side = replica_check.Side(above, role=self.role, strategy=self.strategy)
        final = self.side.step_at(k, load_state(starts_path(self.directory, self.n, k)))[1]
      except Exception as e:  # pylint: disable=broad-except  # a step of float32 constants: judged without it
        self.why_not = replica_check.shortened(first_line(e))
    if self.role.is_chief:
      save_state(above_path(self.directory, self.n, k), {ERROR: np.array(self.why_not)} if self.why_not else final)
    self.answered = k


if __name__ == "__main__":
  gc.freeze()  # the imports' objects out of every collection, as main.py does: a faster exit
  try:
    worker_main(sys.argv)
  except ConfigError as e:
    sys.exit(f"error: {first_line(e)}")
  except BaseException as error:  # pylint: disable=broad-except
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "site-packages" not in frame.filename]
    where = f" (in {frames[-1].filename}:{frames[-1].lineno})" if frames and "(in " not in first_line(error) else ""
    print(f"error: {type(error).__name__}: {first_line(error)}{where}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)  # TensorFlow's collective threads can hang an ordinary exit after a failed collective
