"""Entry point: python main.py --config=configs/digits_cnn.py --workdir=runs/digits [--config.key=value ...]"""

import errno
import gc
import logging as python_logging
import os
import posixpath
import re
import sys
import sysconfig
import traceback
import warnings

import signal


def _interrupted_while_starting(signum, frame):  # pylint: disable=unused-argument
  print("interrupted (Ctrl-C) while starting: nothing was trained or saved", file=sys.stderr, flush=True)
  raise SystemExit(130)  # 128 + SIGINT (preemption.INTERRUPTED_EXIT_CODE, not imported yet); quiet_start replays it


# Ctrl-C during the imports below is one line, not their traceback (main() hands SIGINT back to Python)
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
  signal.signal(signal.SIGINT, _interrupted_while_starting)

# TensorFlow's own start-up and save chatter (CUDA probing on CPU machines, oneDNN notes, per-save INFO lines)
# stays out of a normal run's console; --debug shows all of it. A TF_CPP_MIN_LOG_LEVEL set by the user wins.
from data import quiet_start  # standard library only: TensorFlow is not imported yet

QUIET = quiet_start.for_a_command_line()


class TensorFlowNoiseFilter(python_logging.Filter):
  """Drops what TensorFlow's own Python modules log below ERROR: an INFO line per checkpoint save, deprecation
  notices of its internals (`PreemptionCheckpointHandler.total_run_calls ... is deprecated`, at every preemption
  save), "Switching to regular sync checkpoint". The run says what matters in its own lines; --debug shows all."""

  def filter(self, record):
    return record.levelno >= python_logging.ERROR or f"{os.sep}tensorflow{os.sep}" not in record.pathname


from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags
import tensorflow

from errors import ConfigError, WorkerLostError, config_error_within
from loops import command_line
from loops import finders
from loops import replica_check
from loops import run
from loops import worker_check
from loops.core import console
from loops.persist import preemption

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (configs/*.py[:arg]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, TensorBoard events and results.")
_DEBUG = flags.DEFINE_bool("debug", False, "Show full tracebacks instead of one-line errors.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Check the config, data, cluster and model, print the plan, exit.")
_FIND = flags.DEFINE_enum("find", None, ["lr", "batch_size"], "Instead of training: the LR range test or the "
                          "largest per-replica batch that fits (find.* keys; output in workdir/lr_find or "
                          "workdir/batch_size_find; never a checkpoint).")
_CHECK = flags.DEFINE_enum("check", None, ["replicas", "workers"], "Instead of training: run a few steps from the "
                           "same weights on 1 and on 2 replicas (replicas: loops/replica_check.py), or on one device "
                           "and on multi_worker_mirrored across 2 local worker processes (workers: "
                           "loops/worker_check.py), and compare every variable; exit 0 when they agree, 1 when not. "
                           "Needs no --workdir; writes nothing.")
CHECKS = {"replicas": replica_check.run, "workers": worker_check.run}
flags.mark_flags_as_required(["config"])

# Errors a user can act on; anything else is a bug and keeps its traceback.
USER_ERRORS = (ConfigError, LookupError, FileNotFoundError, PermissionError, FloatingPointError, ValueError,
               WorkerLostError)
DAMAGED_DATA = (tensorflow.errors.DataLossError,)  # a record file that cannot be read: named by _damaged_data


def main(argv):
  if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  if _CHECK.value and (_FIND.value or _DRY_RUN.value):
    sys.exit("error: --check runs steps of its own; it cannot be combined with --find or --dry_run")
  if not _CHECK.value and not _WORKDIR.value:
    sys.exit("error: --workdir is required (where checkpoints, TensorBoard events and results go)")
  if _FIND.value and _DRY_RUN.value:
    sys.exit("error: --find runs trial steps of its own; it cannot be combined with --dry_run (drop one of them)")
  warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
  if QUIET:
    logging.get_absl_handler().addFilter(TensorFlowNoiseFilter())
    python_logging.getLogger("tensorflow").setLevel(python_logging.ERROR)  # tf_logging's own handler too
    if console.is_terminal():  # a person watches: plain lines (logs and SLURM keep absl's time and place)
      logging.get_absl_handler().setFormatter(console.TerminalFormatter())
  preemption.PROCESS_ENDS_AFTER_RUN = True
  try:
    if _CHECK.value:
      sys.exit(0 if CHECKS[_CHECK.value](_CONFIG.value) else 1)
    if _FIND.value:
      finders.find(_FIND.value, _CONFIG.value, _WORKDIR.value)
    else:
      run.train_and_evaluate(_CONFIG.value, _WORKDIR.value, dry_run=_DRY_RUN.value)
  except KeyboardInterrupt:  # Ctrl-C before training started (once it runs, the preemption watcher saves and exits)
    if _DEBUG.value:
      raise
    when = f"during --check={_CHECK.value}" if _CHECK.value else "before training started"
    print(f"interrupted (Ctrl-C) {when}: nothing was trained or saved", file=sys.stderr)
    sys.exit(preemption.INTERRUPTED_EXIT_CODE)
  except Exception as e:  # pylint: disable=broad-except
    refused = config_error_within(e)  # a task's step refused while traced: AutoGraph wraps it (--check, --find)
    user_error = refused is not None or _no_space_left(e) is not None or isinstance(e, USER_ERRORS + DAMAGED_DATA)
    if _DEBUG.value or not user_error:
      raise  # a bug: its traceback
    _exit_with_one_line(refused or e)


def _damaged_data(error):
  """ConfigError naming the record files that cannot be read to the end, for a DataLossError while reading data."""
  from data import tfrecord
  return tfrecord.damaged(tfrecord.damaged_files(_CONFIG.value.data), error)


def _exit_with_one_line(error):
  """Prints `error: ...` (what went wrong, where in the user's code, what to do) and exits: the preemption code
  for a lost peer (Kubernetes' ExitCode policy retries codes >= 128), else 1 (permanent)."""
  logging.flush()
  logging.set_verbosity(logging.ERROR)  # clean-up warnings at exit must not bury the error line
  python_logging.getLogger("tensorflow").setLevel(python_logging.ERROR)
  if isinstance(error, DAMAGED_DATA):
    error = _damaged_data(error)
  full = _no_space_left(error)
  if full is not None:
    print(f"error: no space left on the device of {full}: free some space (or move the workdir) and rerun the same "
          "command; it resumes from the last complete checkpoint (a save that failed is never read)", file=sys.stderr)
    sys.exit(1)
  hint = "" if isinstance(error, (ConfigError, WorkerLostError)) else " (rerun with --debug for the traceback)"
  print(f"error: {command_line.last_line(error)}{_user_location(error)}{hint}", file=sys.stderr)
  sys.exit(_CONFIG.value.preemption.exit_code if isinstance(error, WorkerLostError) else 1)


def parse_flags(argv):
  """absl flag parsing with the config's overrides (loops/command_line.py)."""
  return command_line.parse_flags(_CONFIG, argv)


FRAMEWORK = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                  for name in ("loops" + os.sep, "data" + os.sep, "errors.py", "main.py"))
LIBRARIES = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                   "<frozen"})


def _user_location(error):
  """' (in FILE:LINE)' when the error was raised in the user's code (a loss, model, metric or callback of their
  own), found as the innermost frame outside Python, its libraries and the framework; else ''."""
  if isinstance(error, (ConfigError, WorkerLostError)):
    return ""
  frames = [(frame.filename, frame.lineno) for frame in traceback.extract_tb(error.__traceback__)]
  if str(error).startswith("in user code:"):  # raised while TensorFlow traced it: autograph lists the real frames
    frames = [(name, int(line)) for name, line in re.findall(r'File "([^"]+)", line (\d+)', str(error))]
  frames = [(name, line) for name, line in frames
            if not name.startswith(LIBRARIES) and "__autograph_generated_file" not in name]
  if not frames or frames[-1][0].startswith(FRAMEWORK):
    return ""
  return f" (in {frames[-1][0]}:{frames[-1][1]})"


def _no_space_left(error):
  """The path a write failed on for lack of space (TensorFlow's ResourceExhaustedError or ENOSPC), else None."""
  if isinstance(error, OSError) and error.errno == errno.ENOSPC:
    return error.filename or "the workdir"
  match = re.search(r"(\S+); No space left on device", str(error))
  return posixpath.dirname(match.group(1)) if match else None


if __name__ == "__main__":
  # The million objects of TensorFlow's and Keras' imports live as long as the process: left out of every garbage
  # collection from here on, the run's exit takes ~0.2 s of CPU instead of ~2 s (measured on a dry run).
  gc.freeze()
  app.run(main, flags_parser=parse_flags)
