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
import sys
import uuid

import tensorflow as tf

LOG_LINE = ("train input through the tf.data service at %s (dynamic sharding by epoch): each epoch's batches once; "
            "with one data worker the local order (exact resume, same batches on any replica count), with several "
            "an interleaving in no fixed order (resume restarts the step's epoch place; batches not reproducible)")


def distribute(dataset, address, pipeline_index):
  """`dataset` produced by the service's data workers: dynamic sharding (splits = epochs), its own job."""
  job = f"train-{uuid.uuid4().hex[:12]}-pipeline{pipeline_index}"  # a new job per start: nothing half-consumed
  return dataset.apply(tf.data.experimental.service.distribute(
      processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC, service=address, job_name=job))


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
