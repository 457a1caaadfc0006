"""One run per workdir: the chief holds workdir/run.lock (host, pid, since, heartbeat) while it trains.

A second run on a workdir in use stops before touching anything, naming the holder. A lock whose process is dead
(same host) or whose heartbeat is older than `stale_seconds` (another host: shared or cloud storage, where no pid
can be checked) is taken over with a warning. Every access goes through tf.io.gfile (local, gs://, ram://...).
Object stores have no exclusive create: the lock is written, then read back, and a run that finds another
run's token there stops; two runs starting within the same second can still both pass on such storage.
"""

import contextlib
import datetime
import json
import os
import posixpath
import socket
import threading
import time
import uuid

from absl import logging
import tensorflow as tf

from errors import ConfigError, unwritable_workdir

LOCK_NAME = "run.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0


def pid_alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


class WorkdirLock:
  """acquire() / release(); a daemon thread refreshes the heartbeat every heartbeat_seconds while held."""

  def __init__(self, workdir, heartbeat_seconds=HEARTBEAT_SECONDS, stale_seconds=STALE_SECONDS,
               host=None, pid=None, clock=time.time, is_alive=pid_alive):
    self.path = posixpath.join(workdir, LOCK_NAME)
    self.workdir = workdir
    self._heartbeat_seconds, self._stale_seconds = heartbeat_seconds, stale_seconds
    self._host, self._pid = host or socket.gethostname(), pid or os.getpid()
    self._clock, self._is_alive = clock, is_alive
    self._token = uuid.uuid4().hex
    self._since = None
    self._stop = threading.Event()
    self._thread = None
    self._created_workdir = False

  def acquire(self):
    """Takes the lock or raises ConfigError naming its holder; warns when it takes over a stale lock."""
    holder = self._read()
    if holder is not None:
      stale = self._stale_reason(holder)
      if stale is None:
        raise ConfigError(f"workdir {self.workdir} is in use by another run ({describe(holder)}); wait for it to "
                          f"end or use another --workdir (if that run is gone, delete {self.path})")
      logging.warning("taking over the lock of workdir %s from %s: %s", self.workdir, describe(holder), stale)
    self._created_workdir = not tf.io.gfile.exists(self.workdir)
    self._since = self._clock()
    try:
      self._write()
    except (tf.errors.OpError, OSError) as e:
      raise unwritable_workdir(self.workdir, e) from None
    confirmed = self._read()
    if not confirmed or confirmed.get("token") != self._token:
      raise ConfigError(f"workdir {self.workdir} was just taken by another run ({describe(confirmed or {})}); "
                        "use another --workdir")
    self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat", daemon=True)
    self._thread.start()
    return self

  def release(self):
    """Stops the heartbeat and removes the lock if it is still ours (and a workdir it created, if left empty)."""
    self._stop.set()
    if self._thread:
      self._thread.join(timeout=10)
    holder = self._read()
    if holder and holder.get("token") == self._token:
      tf.io.gfile.remove(self.path)
      if self._created_workdir and not tf.io.gfile.listdir(self.workdir):
        tf.io.gfile.rmtree(self.workdir)

  def _stale_reason(self, holder):
    if holder.get("host") == self._host and isinstance(holder.get("pid"), int):
      if holder["pid"] == self._pid:  # a restarted container: same host name, same pid (often 1)
        return f"process {holder['pid']} is this process (restarted)"
      return None if self._is_alive(holder["pid"]) else f"process {holder['pid']} is no longer running"
    age = self._clock() - float(holder.get("heartbeat", 0))
    if age > self._stale_seconds:
      return f"no heartbeat for {age:.0f} s (more than {self._stale_seconds:.0f} s)"
    return None

  def _beat(self):
    while not self._stop.wait(self._heartbeat_seconds):
      holder = self._read()
      if not holder or holder.get("token") != self._token:
        logging.warning("the lock of workdir %s was taken over by %s; this run no longer holds it", self.workdir,
                        describe(holder or {}))
        return
      self._write()

  def _write(self):
    record = {"host": self._host, "pid": self._pid, "since": self._since, "heartbeat": self._clock(),
              "token": self._token}
    tf.io.gfile.makedirs(self.workdir)
    with tf.io.gfile.GFile(self.path + f".{self._token}.tmp", "w") as f:
      f.write(json.dumps(record))
    tf.io.gfile.rename(self.path + f".{self._token}.tmp", self.path, overwrite=True)

  def _read(self):
    try:
      with tf.io.gfile.GFile(self.path) as f:
        return json.loads(f.read())
    except (tf.errors.NotFoundError, tf.errors.FailedPreconditionError):  # no lock, or no such directory
      return None
    except ValueError:  # a torn or foreign file: treat as held by nobody we can name, but not silently
      return {"host": "?", "pid": None, "since": 0, "heartbeat": 0}


def describe(holder):
  since = holder.get("since")
  when = datetime.datetime.fromtimestamp(since).isoformat(sep=" ", timespec="seconds") if since else "?"
  return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {when}"


@contextlib.contextmanager
def held(workdir, is_chief):
  """The chief holds the workdir's lock for the duration; other processes of the job do not touch it."""
  if not is_chief:
    yield None
    return
  lock = WorkdirLock(workdir).acquire()
  try:
    yield lock
  finally:
    lock.release()
