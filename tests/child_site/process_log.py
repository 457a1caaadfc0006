"""Where the suite's processes spend their CPU: with TESTS_PROCESS_LOG=FILE, every process the tests start appends
one JSON line to FILE as it ends: a fresh one at its exit (`fresh`; whether it imported TensorFlow), a run forked by
tests/fixtures/forks.py when the server reaps it (`forked`). Each line holds the command, CPU and wall seconds and
the test that started it (PYTEST_CURRENT_TEST). A process killed by a signal it does not catch writes nothing.

  TESTS_PROCESS_LOG=/tmp/processes.jsonl python -m pytest -q ...
  python tests/child_site/process_log.py /tmp/processes.jsonl

Standard library only: it runs in every process the tests start.
"""

import atexit
import collections
import json
import os
import resource
import sys
import time

VARIABLE = "TESTS_PROCESS_LOG"


def write(path, kind, argv, cpu, wall, test, tensorflow=None):
  """Appends one process's line to `path` (one write: lines of concurrent processes do not interleave)."""
  line = {"kind": kind, "argv": list(argv)[:8], "cpu": round(cpu, 3), "wall": round(wall, 3), "test": test}
  if tensorflow is not None:
    line["tensorflow"] = tensorflow
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, (json.dumps(line) + "\n").encode())
  finally:
    os.close(fd)


def log_this_process():
  """When TESTS_PROCESS_LOG is set: this process's line at its exit, unless it is a fork's child by then (the fork
  server's runs are logged by the server)."""
  path = os.environ.get(VARIABLE)
  if not path:
    return
  pid, started = os.getpid(), time.monotonic()

  def at_exit():
    if os.getpid() == pid:
      usage = resource.getrusage(resource.RUSAGE_SELF)
      write(path, "fresh", sys.orig_argv[1:], usage.ru_utime + usage.ru_stime, time.monotonic() - started,
            os.environ.get("PYTEST_CURRENT_TEST", ""), tensorflow="tensorflow" in sys.modules)

  atexit.register(at_exit)


def summary(lines, top=15):
  """Text: processes and CPU seconds by kind (fresh ones with and without TensorFlow), then the `top` tests by the
  CPU of the processes they started."""
  kinds, tests = collections.defaultdict(lambda: [0, 0.0]), collections.Counter()
  for line in lines:
    kind = line["kind"] + (" (TensorFlow)" if line.get("tensorflow") else "")
    kinds[kind][0] += 1
    kinds[kind][1] += line["cpu"]
    tests[line["test"].split(" ")[0] or "(no test: started outside one)"] += line["cpu"]
  text = [f"{kind}: {count} processes, {cpu:.1f} s of CPU" for kind, (count, cpu) in sorted(kinds.items())]
  return "\n".join(text + [f"  {cpu:7.1f} s  {test}" for test, cpu in tests.most_common(top)])


if __name__ == "__main__":
  with open(sys.argv[1], encoding="utf-8") as log:
    print(summary(json.loads(line) for line in log if line.strip()))
