"""One sweep per sweep directory: a running sweep holds DIR/sweep.lock (host, pid, since).

The lock is the kernel's (`fcntl.flock` on the file, held while the sweep runs): it goes with its holder however the
holder ends, kill -9 included, so a lock left by a sweep that is gone is taken over (one line names it), and a second
sweep on the directory while the first runs is refused in one line naming the first's pid. The file's text only
names the holder. `--report` reads without the lock. Pure Python (Linux and macOS).
"""

import datetime
import fcntl
import json
import os
import socket
import sys
import time

from launch import sweep_grid

LOCK_NAME = "sweep.lock"


class SweepLock:
  """acquire(out) / release(); held from acquire to release (or the end of this process)."""

  def __init__(self, sweep_dir):
    self.sweep_dir, self.path = sweep_dir, os.path.join(sweep_dir, LOCK_NAME)
    self.fd, self.created_dir = None, False

  def acquire(self, out):
    """Takes the lock; SweepError naming the holder when another live sweep has it."""
    self.created_dir = not os.path.isdir(self.sweep_dir)
    os.makedirs(self.sweep_dir, exist_ok=True)
    while self.fd is None:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        self._remove_created_dir()
        who = (f"another sweep ({describe(holder)})" if holder else
               "the running tasks of a SLURM job array of this sweep (sweep.sbatch)")
        raise sweep_grid.SweepError(f"sweep directory {self.sweep_dir} is in use by {who}: wait for it to end, or "
                                    "use another --sweep_dir") from None
      if _same_file(fd, self.path):
        self.fd = fd
      else:  # the holder released (removed) the file between our open and our lock: once more
        os.close(fd)
    previous = _holder(self.fd, wait_seconds=0)
    if previous.get("pid") not in (None, os.getpid()):
      out.write(f"[sweep] taking over {self.path} from a sweep that is gone ({describe(previous)})\n")
    record = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
    os.ftruncate(self.fd, 0)
    os.pwrite(self.fd, json.dumps(record).encode(), 0)
    return self

  def release(self):
    """Removes the lock file (and the directory if acquire made it and nothing else is in it), then unlocks."""
    if self.fd is None:
      return
    if _same_file(self.fd, self.path):
      os.remove(self.path)
    os.close(self.fd)
    self.fd = None
    self._remove_created_dir()

  def _remove_created_dir(self):
    if self.created_dir:
      try:
        os.rmdir(self.sweep_dir)
      except OSError:  # not empty: the sweep wrote its files
        pass


def _same_file(fd, path):
  try:
    return os.stat(path).st_ino == os.fstat(fd).st_ino
  except FileNotFoundError:
    return False


def _holder(fd, wait_seconds=1.0):
  """The holder's record in the lock file ({} when unreadable); waits a moment for a holder still writing it."""
  deadline = time.monotonic() + wait_seconds
  while True:
    try:
      return json.loads(os.pread(fd, 4096, 0).decode())
    except ValueError:
      if time.monotonic() >= deadline:
        return {}
      time.sleep(0.05)


def share(fd, sweep_dir):
  """A SLURM array task's share of the lock on the open file `fd` (sweep.sbatch: its shell keeps fd open, so the
  lock lasts as long as the task); SweepError when a sweep started with launch.sweep holds it alone."""
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
  except BlockingIOError:
    raise sweep_grid.SweepError(f"sweep directory {sweep_dir} is in use by a sweep started with launch.sweep "
                                f"({describe(_holder(fd))}): this array task waits for nothing and ends; resubmit "
                                "the array when that sweep is over") from None


def main(argv):
  """python -m launch.sweep_lock --shared=FD SWEEP_DIR (sweep.sbatch's array tasks)."""
  if len(argv) != 2 or not argv[0].startswith("--shared="):
    raise SystemExit("usage: python -m launch.sweep_lock --shared=FD SWEEP_DIR")
  try:
    share(int(argv[0].split("=", 1)[1]), argv[1])
  except sweep_grid.SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    raise SystemExit(1) from None


def describe(holder):
  """'pid P on host H, since T' of a lock record."""
  since = holder.get("since")
  when = datetime.datetime.fromtimestamp(since).isoformat(sep=" ", timespec="seconds") if since else "?"
  return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, since {when}"


if __name__ == "__main__":
  main(sys.argv[1:])
