"""Every rank's host:port through the shared workdir, for a cluster started by an MPI launcher.

Rank r writes `<workdir>/.cluster/<job key>/rank-r.json` ({"rank", "size", "address"}; written whole, then renamed)
and reads the others' files until it has all of them; the job key (loops/distribute/mpi.py) keeps other launches
apart. Each rank removes its own file once every peer answers (startup.bounded_start): by then all have read it;
a rank that stops before (a config error after the exchange) removes it when it exits, so that a later launch under
a key that can repeat (Hydra's) never reads it.
"""

import atexit
import json
import posixpath
import socket
import time

from errors import ConfigError, WorkerLostError


def folder(workdir, key):
  return posixpath.join(workdir, ".cluster", key)


def rank_file(workdir, key, rank):
  return posixpath.join(folder(workdir, key), f"rank-{rank}.json")


def this_host():
  """This machine's name if it resolves (what its peers connect to), else its fully qualified name."""
  for name in (socket.gethostname(), socket.getfqdn()):
    try:
      socket.getaddrinfo(name, None)
      return name
    except OSError:
      continue
  raise ConfigError(f"cannot resolve this machine's name '{socket.gethostname()}' to an address; its peers could "
                    "not reach it (fix /etc/hosts or DNS)")


def free_port():
  """A port the OS reports free (the probe socket is closed at once: startup.bounded_start binds it again)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.bind(("", 0))
    return probe.getsockname()[1]


def publish(workdir, key, rank, size, address):
  """Writes this rank's file (whole, then renamed: a reader never sees half of it); returns its path."""
  import tensorflow as tf

  tf.io.gfile.makedirs(folder(workdir, key))
  path = rank_file(workdir, key, rank)
  partial = f"{path}.partial"
  with tf.io.gfile.GFile(partial, "w") as f:
    f.write(json.dumps({"rank": rank, "size": size, "address": address}))
  tf.io.gfile.rename(partial, path, overwrite=True)
  return path


def collect(workdir, key, size, timeout_seconds, poll_seconds=0.2):
  """Every rank's address in rank order, once all `size` files exist; WorkerLostError naming the ranks whose file
  is still missing after timeout_seconds, ConfigError for a file of another launch (another size)."""
  deadline = time.monotonic() + timeout_seconds
  addresses = {}
  while True:
    for rank in range(size):
      if rank not in addresses:
        found = _read(rank_file(workdir, key, rank), size)
        if found:
          addresses[rank] = found
    if len(addresses) == size:
      return [addresses[rank] for rank in range(size)]
    if time.monotonic() > deadline:
      missing = ", ".join(str(rank) for rank in range(size) if rank not in addresses)
      raise WorkerLostError(f"the MPI ranks did not meet within cluster.startup_timeout_seconds="
                            f"{timeout_seconds:g}: no address from rank(s) {missing} in "
                            f"{folder(workdir, key)} (did they start? do all nodes share the workdir?)")
    time.sleep(poll_seconds)


def _read(path, size):
  import tensorflow as tf

  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    entry = json.loads(f.read())
  if entry.get("size") != size:
    raise ConfigError(f"{path} belongs to a launch of {entry.get('size')} ranks, this one has {size}: remove "
                      f"{posixpath.dirname(path)}")
  return entry["address"]


def exchange(workdir, key, rank, size, timeout_seconds):
  """(every rank's host:port in rank order, this rank's file): this rank publishes a free port and collects."""
  own = publish(workdir, key, rank, size, f"{this_host()}:{free_port()}")
  atexit.register(forget, own)  # also when this rank stops before the cluster starts (no-op once forgotten)
  return collect(workdir, key, size, timeout_seconds), own


def forget(path):
  """Removes a rank's file (once its peers have read it), and the launch's folder once it is empty; a file or
  folder another rank removed first is fine."""
  if not path:
    return
  import tensorflow as tf

  try:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
    if not tf.io.gfile.listdir(posixpath.dirname(path)):
      tf.io.gfile.rmtree(posixpath.dirname(path))
  except tf.errors.NotFoundError:
    pass
