"""A `python main.py ...` (or `python -m NAME ...` of MODULES: the check pairs' worker, the data service and prepare,
benchmarks) of this repository, started by a test or by the processes under test (launch.local's workers and data
service, a sweep's trials, --check=workers' pairs), runs in a child forked from tests/fixtures/forks.py, an
interpreter that imported main.py once: the same run without its ~3 s of CPU importing TensorFlow. The process the
test started stays as the run's stand-in (its client, ~20 ms of CPU): it hands the server its command line,
environment, folder, CPU affinity, umask and standard streams, relays the signals a run reacts to, and exits as the
run exits (a signal's death included). When the stand-in is killed (SIGKILL), the run kills itself. The run is in the
server's process group and session, not the stand-in's: a `killpg` of the stand-in's group reaches it through the
relay (or the SIGKILL rule), and the processes the run starts itself are not in that group.

What a fork cannot show runs fresh (`fresh_reason`): what acts at import (--debug, a variable READ_AT_IMPORT other
than the server's), another checkout's main.py, Python options, processes real SLURM or Open MPI manage, and every
process when TESTS_FRESH_PROCESSES=1. Standard library only: it runs in every process the tests start.
"""

import json
import os
import signal
import socket
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = "TESTS_FORK_SERVER"  # the fork server's socket, set by tests/conftest.py
# `python -m NAME` run from the repository's folder
MODULES = ("loops.worker_check", "data.service", "data.prepare", "benchmarks.throughput", "benchmarks.records",
           "benchmarks.predict")
# read when TensorFlow and Keras are imported: a run given other values than the fork server's runs fresh
READ_AT_IMPORT = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TF_ENABLE_ONEDNN_OPTS",
                  "KERAS_HOME", "KERAS_BACKEND")
MANAGED = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "PMI_RANK")  # a real SLURM's or mpirun's process: kept real
# the signals a run reacts to (loops/persist/preemption.py's CATCHABLE_SIGNALS and SIGQUIT), relayed to it
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGCONT,
           signal.SIGQUIT)
MESSAGE_BYTES = 1 << 20
NAMESPACES = ("net", "mnt", "user", "pid")


def target(args, cwd):
  """What `python ARGS` started in `cwd` runs, when the server can run it: ("script", path) for this repository's
  main.py, ("module", name) for MODULES run from the repository; None for anything else."""
  if args[:1] == ["-m"] and len(args) >= 2 and args[1] in MODULES and _same(cwd, REPO):
    return ("module", args[1])
  if args and not args[0].startswith("-") and _same(os.path.join(cwd, args[0]), os.path.join(REPO, "main.py")):
    return ("script", os.path.abspath(os.path.join(cwd, args[0])))
  return None


def _same(a, b):
  return os.path.realpath(a) == os.path.realpath(b)


def fresh_reason(args, env, cwd, imported_with=None, spaces=None):
  """Why `python ARGS` with `env` in `cwd` (in Linux namespaces `spaces`) must start fresh, or None when a fork from
  the server's imports (made with `imported_with`, READ_AT_IMPORT's values) runs it as a fresh process would. The
  client asks without the server's values (None: not compared), the server with them."""
  if env.get("TESTS_FRESH_PROCESSES") == "1":
    return "TESTS_FRESH_PROCESSES=1"
  if target(args, cwd) is None:
    return "not main.py or " + ", ".join(MODULES) + " of this repository, or Python options"
  if "--debug" in args:
    return "--debug acts at import"
  managed = [name for name in MANAGED if name in env]
  if managed:
    return f"{managed[0]}: a process real SLURM or Open MPI manages"
  if spaces is not None and spaces != namespaces():
    return "in other Linux namespaces (unshare) than the server"
  differing = [name for name in READ_AT_IMPORT if env.get(name) != (imported_with or env).get(name)]
  if differing:
    return f"{differing[0]} acts at import"
  return None


def request():
  """What the server needs to run this process's command as this process would."""
  return {"orig_argv": sys.orig_argv, "env": dict(os.environ), "cwd": os.getcwd(),
          "affinity": sorted(os.sched_getaffinity(0)), "umask": _umask(), "ppid": os.getppid(),
          "namespaces": namespaces(), "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN}


def namespaces():
  """This process's Linux namespaces (network, mounts, user, pids): a fork from a server in others would not be in
  this process's network (tests/test_k8s.py's pods) or see its files."""
  return {name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES}


def _umask():
  mask = os.umask(0)
  os.umask(mask)
  return mask


def run_forked():
  """When a fork server is there and takes this process's command: runs it there and exits as the run exits.
  Returns (the process goes on as a fresh one) otherwise."""
  path = os.environ.get(SERVER)
  args = sys.orig_argv[1:]
  if not path or fresh_reason(args, os.environ, os.getcwd()) is not None:
    return
  connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  try:
    connection.connect(path)
    socket.send_fds(connection, [json.dumps(request()).encode()], [0, 1, 2])
    answer = json.loads(connection.recv(MESSAGE_BYTES) or b"{}")
  except OSError:  # no server (any more): fresh
    return
  except KeyboardInterrupt:  # Ctrl-C before the run started: as Python ends on it (the run, if forked, ends too)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)  # pylint: disable=protected-access
  if "pid" not in answer:
    return
  try:  # the run started: this process never goes on as a fresh one
    code = _stand_in(connection, answer["pid"])
  except BaseException as error:  # pylint: disable=broad-except
    os.write(2, f"tests/child_site/forked.py: {error!r}\n".encode())
    code = None
  if code is None:
    os.write(2, b"tests/fixtures/forks.py ended before the run it started\n")
    os._exit(1)  # pylint: disable=protected-access
  if code < 0:
    if -code not in (signal.SIGKILL, signal.SIGSTOP):
      signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
  os._exit(code if code >= 0 else 128 - code)  # pylint: disable=protected-access


def _stand_in(connection, pid):
  """Relays the signals a run reacts to until the server says how the run ended; its exit code (None: no answer)."""
  for signum in RELAYED:
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, lambda number, _: _relay(pid, number))
  ended = connection.recv(MESSAGE_BYTES)
  return json.loads(ended)["exit"] if ended else None


def _relay(pid, signum):
  try:
    os.kill(pid, signum)
  except ProcessLookupError:
    pass
