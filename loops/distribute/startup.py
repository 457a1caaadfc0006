"""A multi-worker start that cannot hang: the port checked before binding, the wait for peers bounded.

TensorFlow's MultiWorkerMirroredStrategy waits inside C++ until every worker has connected, with no timeout,
holding Python's GIL (no Python handler or thread runs) and with its own SIGTERM handler installed: a worker whose
peer never came ignored SIGTERM and Ctrl-C. `bounded_start` waits for the peers in Python first, and watches
TensorFlow's own start from a separate process (startup_watchdog.py).
"""

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time

from errors import ConfigError, WorkerLostError
from loops.distribute import rendezvous
from loops.distribute import startup_watchdog

WATCHDOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup_watchdog.py")


def check_port_free(role):
  """Raises ConfigError naming host:port when this process's own cluster port is already taken."""
  address = role.cluster[role.type][role.index]
  port = int(address.rpartition(":")[2])
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed run's TIME_WAIT is not "in use"
    try:
      probe.bind(("", port))
    except OSError as e:
      if e.errno != errno.EADDRINUSE:
        raise
      raise ConfigError(f"port {port} of {role.type} {role.index} ({address}) is in use by another process; "
                        "free it or give this cluster other ports (TF_CONFIG, or cluster.slurm_port_base under "
                        "SLURM)") from None


def peers(role):
  """{'worker 1': 'host:port', ...}: the cluster's other processes."""
  return {f"{job} {index}": address for job, addresses in role.cluster.items()
          for index, address in enumerate(addresses) if (job, index) != (role.type, role.index)}


@contextlib.contextmanager
def bounded_start(role, timeout_seconds):
  """Runs the body (the cluster's start) once every peer's port answers, each bounded by `timeout_seconds`.

  First, in Python (signals work): this process's port is held by a plain listener while it waits for a TCP answer
  from every peer; past the timeout, WorkerLostError names the peers nothing listens for. Then TensorFlow's start
  runs under a watchdog process that ends it (SIGKILL: TensorFlow's own SIGTERM handler swallows SIGTERM while it
  waits) with one line when it takes longer. Only for a task of a multi-worker cluster; otherwise the body just
  runs. An MPI rank's address file (rendezvous.py) is removed once every peer answers.
  """
  if not role.is_distributed:
    yield
    return
  _wait_for_peers(role, timeout_seconds)
  rendezvous.forget(role.rendezvous_file)  # every peer listens: each has read this process's address (MPI)
  watchdog = subprocess.Popen([sys.executable, WATCHDOG, str(os.getpid()), str(timeout_seconds),
                               json.dumps(peers(role))], stdin=subprocess.PIPE)
  try:
    yield
  finally:
    watchdog.stdin.close()  # end of input: the start is over
    watchdog.wait()


def _wait_for_peers(role, timeout_seconds, poll_seconds=0.5):
  own = int(role.cluster[role.type][role.index].rpartition(":")[2])
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:  # peers' probes find this process up
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", own))
    listener.listen(64)
    deadline = time.monotonic() + timeout_seconds
    waiting = startup_watchdog.unreachable(peers(role), timeout=poll_seconds)
    while waiting:
      if time.monotonic() > deadline:
        raise WorkerLostError(f"the cluster did not start within cluster.startup_timeout_seconds="
                              f"{timeout_seconds:g}: nothing listens for {', '.join(waiting)}: did it start? (see "
                              "its log)")
      time.sleep(poll_seconds)
      waiting = startup_watchdog.unreachable(peers(role), timeout=poll_seconds)
