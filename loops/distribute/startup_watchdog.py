"""Watches a worker's start from outside (standard library only; see startup.py):

  python startup_watchdog.py PID TIMEOUT_SECONDS '{"worker 1": "host:port", ...}'

Exits quietly when its standard input ends (the start is over, or the worker died). After TIMEOUT_SECONDS it
prints one line and ends the worker with SIGKILL (TensorFlow handles SIGTERM itself while it waits).
"""

import json
import os
import select
import signal
import socket
import sys


def unreachable(peers, timeout=1.0):
  """The peers ('worker 1 (host:port)') whose address refuses or does not answer a TCP connection."""
  missing = []
  for name, address in peers.items():
    host, _, port = address.rpartition(":")
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError:
      missing.append(f"{name} ({address})")
  return missing


def main(pid, timeout_seconds, peers):
  ready, _, _ = select.select([sys.stdin], [], [], timeout_seconds)
  if ready:
    return  # input ended: started (or the worker is gone)
  missing = unreachable(peers)
  who = (f"nothing listens for {', '.join(missing)} any more (see its log)" if missing else
         "every peer's port answers but TensorFlow's start did not finish: a port may belong to another program, "
         "or a peer failed while starting (see the other workers' logs)")
  sys.stderr.write(f"error: the cluster did not start within cluster.startup_timeout_seconds={timeout_seconds:g}: "
                   f"{who}; ending this worker\n")
  sys.stderr.flush()
  os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
  main(int(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]))
