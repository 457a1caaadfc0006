"""tf.data service: TensorFlow's own engine for input work on other machines (a dispatcher and data workers).

  python -m data.service dispatcher --port=5050 [--work_dir=DIR]    one per job
  python -m data.service worker --dispatcher=HOST:5050 [--port=0]   as many as the input work needs

Train with `--config.data.service=grpc://HOST:5050` (`python -m launch.local --data_workers N` starts a local pool
and sets it). Each input pipeline's train dataset, reading, decoding and augmentation included, then runs on the
data workers, as its own job; the training hosts only receive finished batches.

What holds (one log line says so at the start of training): the dataset is sharded dynamically by epoch (the
pipeline's only source is the range of epochs), so every epoch's batches are produced exactly once, each epoch
by one data worker, with the keys of their steps (flips and mixes as without the service). With ONE data worker
the order is exactly the local one: resume is exact and N replicas see what one sees. With several, epochs are
produced side by side and their batches arrive interleaved in no fixed order: a resumed run restarts at its step's
place in its epoch (batches that other workers had already delivered from later epochs come again), and the
batches a step gets are not reproducible across runs or replica counts.
"""

import argparse
import socket
import sys
import threading
import time
import uuid

from data import quiet_start

if __name__ == "__main__":
  quiet_start.for_a_command_line()

import tensorflow as tf  # pylint: disable=wrong-import-position

from errors import WorkerLostError  # pylint: disable=wrong-import-position

LOG_LINE = ("train input through the tf.data service at %s (dynamic sharding by epoch): each epoch's batches once; "
            "with one data worker the local order (exact resume, same batches on any replica count), with several "
            "an interleaving in no fixed order (resume restarts the step's epoch place; batches not reproducible)")


class DataServiceLostError(WorkerLostError):
  """The tf.data service did not answer within data.service_timeout_seconds: a restartable failure."""


class Arrivals:
  """When the last batch came from the service, and the longest gap between two (read by the training's watch)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.last = None
    self.longest_gap = 0.0
    self.probing = False  # wait_for_dispatcher runs
    self.interrupted = None  # set to a signal name by the watch: a wait in Python (the dispatcher probe) ends

  def mark(self):
    now = time.monotonic()
    with self.lock:
      if self.last is not None:
        self.longest_gap = max(self.longest_gap, now - self.last)
      self.last = now
    return 0


ARRIVALS = Arrivals()


def reachable(address, timeout=1.0):
  """Whether grpc://HOST:PORT accepts a TCP connection."""
  host, _, port = address.split("://", 1)[-1].rpartition(":")
  try:
    socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    return True
  except (OSError, ValueError):
    return False


def wait_for_dispatcher(address, timeout_seconds, poll_seconds=0.5):
  """Returns once the dispatcher at `address` accepts a connection; DataServiceLostError past the timeout or on a
  signal (TensorFlow itself would wait for it forever, deaf to SIGTERM)."""
  deadline = time.monotonic() + timeout_seconds
  ARRIVALS.probing = True  # the watch leaves this wait to this loop
  try:
    while not reachable(address, timeout=poll_seconds):
      if ARRIVALS.interrupted or time.monotonic() > deadline:
        cause = (f"{ARRIVALS.interrupted} while waiting for it" if ARRIVALS.interrupted else
                 f"waited data.service_timeout_seconds={timeout_seconds:g}")
        raise DataServiceLostError(
            f"the tf.data service dispatcher at {address} does not answer ({cause}): nothing listens there; start "
            "it (python -m data.service dispatcher --port=PORT, or python -m launch.local --data_workers K) or fix "
            "data.service")
      time.sleep(poll_seconds)
  finally:
    ARRIVALS.probing = False


def distribute(dataset, address, pipeline_index, timeout_seconds=None):
  """`dataset` produced by the service's data workers: dynamic sharding (splits = epochs), its own job. With
  `timeout_seconds`, the dispatcher must answer within it first (TensorFlow's own wait has no bound); each batch's
  arrival is marked in ARRIVALS."""
  if timeout_seconds is not None:
    wait_for_dispatcher(address, timeout_seconds)
  job = f"train-{uuid.uuid4().hex[:12]}-pipeline{pipeline_index}"  # a new job per start: nothing half-consumed
  dataset = dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=address, job_name=job))
  return dataset.map(_marked)


def _marked(*element):
  with tf.control_dependencies([tf.numpy_function(ARRIVALS.mark, [], tf.int64, stateful=True)]):
    return tf.nest.map_structure(tf.identity, element if len(element) > 1 else element[0])


def command_line():
  parser = argparse.ArgumentParser(prog="python -m data.service", description=__doc__.split("\n\n")[0])
  parser.add_argument("role", choices=["dispatcher", "worker"])
  parser.add_argument("--port", type=int, default=0, help="port to serve on (0: any free port)")
  parser.add_argument("--dispatcher", help="worker: the dispatcher's HOST:PORT")
  parser.add_argument("--work_dir", default=None, help="dispatcher: a directory for its journal (restartable)")
  return parser


def serve(argv=None):
  """Runs a dispatcher or a data worker until the process is stopped."""
  parser = command_line()
  args = parser.parse_args(argv)
  service = tf.data.experimental.service
  if args.role == "dispatcher":
    server = service.DispatchServer(service.DispatcherConfig(
        port=args.port, work_dir=args.work_dir, fault_tolerant_mode=bool(args.work_dir)))
  else:
    if not args.dispatcher:
      parser.error("a worker needs --dispatcher=HOST:PORT")
    server = service.WorkerServer(service.WorkerConfig(dispatcher_address=args.dispatcher.replace("grpc://", ""),
                                                       port=args.port))
  print(f"tf.data service {args.role} serving at {server.target if args.role == 'dispatcher' else args.port}",
        flush=True)
  server.join()


if __name__ == "__main__":
  sys.exit(serve())
