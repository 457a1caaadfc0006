"""Shared test setup: two logical CPUs (before TensorFlow starts) so mirrored runs get 2 replicas in-process."""

import atexit
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_SITE = os.path.join(REPO, "tests", "child_site")  # its sitecustomize.py: Keras' unused optional imports skipped


def pythonpath(*folders):
  """PYTHONPATH for a child: `folders` of its own, then the tests' (tests/child_site unless TESTS_CHILD_SITE=0)."""
  return os.pathsep.join([*folders, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])


# TESTS_CHILD_SITE=0: the children import Keras as a user's processes do
if os.environ.get("TESTS_CHILD_SITE") != "0" and CHILD_SITE not in os.environ.get("PYTHONPATH", "").split(
    os.pathsep):
  os.environ["PYTHONPATH"] = pythonpath(CHILD_SITE)

import keras
import pytest
import tensorflow as tf

CPU_REPLICAS = 2
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * CPU_REPLICAS)


def load_config(name, arg=None):
  """configs/<name>.py's get_config(arg), imported as config_flags would."""
  import importlib
  module = importlib.import_module(f"configs.{name}")
  return module.get_config(arg)


def set_keys(config, overrides):
  """config with each dotted key of `overrides` set (new keys allowed, as under model.kwargs); returns config."""
  for key, value in overrides.items():
    node, parts = config, key.split(".")
    for part in parts[:-1]:
      node = node[part]
    with config.unlocked():
      node[parts[-1]] = value
  return config


def run_main(*args, env=None, unset=(), timeout=300):
  """Runs `python main.py args...` (env added, `unset` variables removed) as run_command does; returns the
  CompletedProcess."""
  fork_server.start()
  full_env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", *unset)}
  full_env.update(env or {})
  return run_command([sys.executable, os.path.join(REPO, "main.py"), *args], env=full_env, timeout=timeout)


def run_command(command, env=None, cwd=REPO, timeout=300, merge_output=False):
  """subprocess.run(command, env=env, cwd=cwd, ...) with its output captured as text (stderr into stdout when
  merge_output); returns the CompletedProcess. A `python main.py ...` of this repository runs forked from main.py's
  imports (the fork server: tests/fixtures/forks.py)."""
  fork_server.start()
  env = dict(os.environ) if env is None else env
  return subprocess.run(command, cwd=cwd, env=env, timeout=timeout, text=True, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT if merge_output else subprocess.PIPE)


class ForkServer:
  """tests/fixtures/forks.py for the processes this test process starts (tests/child_site/forked.py, its client,
  runs in each of them): started at the first test that starts processes, its socket in TESTS_FORK_SERVER, ended
  (and waited for: its runs' CPU counts in this process's children's) with this process. Not started with
  TESTS_FRESH_PROCESSES=1 or TESTS_CHILD_SITE=0: every process then starts fresh."""

  def __init__(self):
    self.process = None

  def start(self):
    if (self.process is not None or os.environ.get("TESTS_FRESH_PROCESSES") == "1"
        or CHILD_SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep)):
      return
    from launch import local
    folder = tempfile.mkdtemp(prefix="forks-")
    path = os.path.join(folder, "socket")
    self.process = subprocess.Popen([sys.executable, os.path.join(REPO, "tests", "fixtures", "forks.py"), path],
                                    cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    preexec_fn=local.dying_with_this_process(signal.SIGKILL))
    atexit.register(self.end, folder)
    while not os.path.exists(path) and self.process.poll() is None:  # bound before it imports: clients queue
      time.sleep(0.01)
    os.environ["TESTS_FORK_SERVER"] = path

  def end(self, folder):
    os.environ.pop("TESTS_FORK_SERVER", None)
    self.process.kill()
    self.process.wait()
    shutil.rmtree(folder, ignore_errors=True)


fork_server = ForkServer()


def ctrl_c_reaches_it():
  """preexec_fn for a child a test sends Ctrl-C (SIGINT): SIGINT at its default, so Python turns it into
  KeyboardInterrupt. A suite started as a shell's background job (or by a runner that does the same) inherits SIGINT
  ignored, every child with it, and Python leaves an ignored SIGINT ignored."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(autouse=True)
def processes_fork_from_prepared_imports(request):
  """A test that starts processes (marked e2e or slow) has the fork server (ForkServer) running."""
  if request.node.get_closest_marker("e2e") or request.node.get_closest_marker("slow"):
    fork_server.start()


@pytest.fixture(autouse=True)
def info_logging():
  """Each test starts with absl at INFO (what tests reading caplog expect), whatever an earlier test in this
  process left (main.main, the batch-size finder and others change the verbosity)."""
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.INFO)


def process_state():
  """What a test may change for the whole process: op determinism, Grappler's constant folding, the Keras dtype
  policy, signal handlers, the signal wakeup fd and the preemption module's globals."""
  from loops import private_apis
  from loops.persist import preemption
  wakeup = signal.set_wakeup_fd(-1)
  signal.set_wakeup_fd(wakeup)
  return {"determinism": private_apis.op_determinism_enabled(),
          "constant_folding": tf.config.optimizer.get_experimental_options().get("constant_folding", True),
          "policy": keras.mixed_precision.dtype_policy().name,
          "handlers": {signal.Signals[name]: signal.getsignal(signal.Signals[name])
                       for name in preemption.CATCHABLE_SIGNALS}, "wakeup_fd": wakeup,
          "process_ends_after_run": preemption.PROCESS_ENDS_AFTER_RUN,
          "signal_listeners": list(preemption.SIGNAL_LISTENERS), "received": list(preemption.RECEIVED)}


def restore_process_state(saved):
  from loops import private_apis
  from loops.persist import preemption
  if private_apis.op_determinism_enabled() != saved["determinism"]:
    if saved["determinism"]:
      tf.config.experimental.enable_op_determinism()
    else:
      private_apis.disable_op_determinism()
  tf.config.optimizer.set_experimental_options({"constant_folding": saved["constant_folding"]})
  keras.mixed_precision.set_dtype_policy(saved["policy"])
  for number, handler in saved["handlers"].items():
    if handler is not None:  # None: set outside Python, cannot be set back from here
      signal.signal(number, handler)
  signal.set_wakeup_fd(saved["wakeup_fd"])
  preemption.PROCESS_ENDS_AFTER_RUN = saved["process_ends_after_run"]
  preemption.SIGNAL_LISTENERS[:] = saved["signal_listeners"]
  preemption.RECEIVED[:] = saved["received"]


@pytest.fixture(autouse=True)
def process_state_restored():
  """Each test leaves the process-wide state (process_state) as it found it, whatever it or the code it ran set."""
  saved = process_state()
  yield
  restore_process_state(saved)


@pytest.fixture
def tiny_digits():
  """digits_cnn config shortened to a few steps."""
  c = load_config("digits_cnn")
  c.train.epochs = None
  c.train.steps = 20
  c.train.steps_per_loop = 5
  c.eval.every_steps = 10
  c.checkpoint.every_steps = 10
  return c


_file_durations = []  # the Recorder of --record-file-durations, in the controlling process only


def pytest_addoption(parser):
  parser.addoption("--record-file-durations", action="store_true",
                   help="measure each test file's seconds into tests/file_durations.json (the order of the suite)")


def pytest_configure(config):
  if config.getoption("record_file_durations") and not hasattr(config, "workerinput"):
    from tests import file_order
    _file_durations.append(file_order.Recorder())


def pytest_collection_modifyitems(config, items):
  """Longest files first (tests/file_order.py): the two workers of the suite end together."""
  from tests import file_order
  file_order.longest_first(items, file_order.load())


def pytest_runtest_logreport(report):
  for recorder in _file_durations:
    recorder.add(report.nodeid, report.duration)


def pytest_sessionfinish(session):
  for recorder in _file_durations:
    recorder.write()


@pytest.fixture(scope="session")
def quickstart_digits(tmp_path_factory):
  """The digits quickstart (configs/digits_cnn.py as it is: one device, 1 100 steps, exported) trained to the end
  once per suite: (workdir, summary), read only. tests/test_train.py's one-device run, tests/test_tasks.py's
  teacher: the first test process to need it trains it, another (an xdist worker) waits for it and reads it."""
  from loops import run
  shared = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    shared = shared.parent  # this session's directory, common to its workers
  workdir, summary = shared / "quickstart", shared / "quickstart_summary.json"
  with open(shared / "quickstart.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not summary.exists():
      summary.write_text(json.dumps(run.train_and_evaluate(load_config("digits_cnn"), str(workdir))))
  return str(workdir), json.loads(summary.read_text())


@pytest.fixture(scope="module")
def trained_digits(tmp_path_factory):
  """A digits run of 20 steps: eval and checkpoints at 10 and 20, the best kept; (config, workdir, its eval
  accuracy curve {step: value})."""
  from loops import run
  from tests.test_sidecar import event_scalars
  config = load_config("digits_cnn")
  config.train.epochs, config.train.steps, config.train.steps_per_loop = None, 20, 5
  config.eval.every_steps = config.checkpoint.every_steps = 10
  config.export = False
  workdir = str(tmp_path_factory.mktemp("trained") / "w")
  run.train_and_evaluate(config, workdir)
  return config, workdir, event_scalars(workdir, "eval/accuracy")
