"""Runs one command as N local processes with TF_CONFIG on loopback ports (the analogue of `horovodrun -np N`).

  python -m launch.local --workers 2 -- python main.py --config=configs/digits_cnn.py --workdir=runs/mw \\
      --config.strategy=multi_worker_mirrored

Each process's output lines are prefixed with its name ("[worker:1] ..."). When a process fails, the others are
stopped and the launcher exits with that task's code, naming it; a task killed by a signal (kill -9, the OOM
killer) is a lost worker: the launcher exits with the preemption code (143, or the command's
--config.preemption.exit_code), as the surviving workers do, so that a wrapper restarts the job. With --ps M the
cluster gets a chief (the coordinator), N workers and M parameter servers; the job ends when the chief ends. --evaluator adds a sidecar
evaluator process (not part of the cluster, as AI Platform writes it) that evaluates each checkpoint the job writes;
the job then also waits for it to evaluate the final one. --data_workers K starts a tf.data service beside the
job (a dispatcher and K data workers: `python -m data.service`) and appends --config.data.service=grpc://... to the
command, so the train input's work runs there; they are stopped when the job ends.
"""

import argparse
import ctypes
import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

LOOPBACK = "127.0.0.1"
PREEMPTED = 143  # the default preemption.exit_code (configs/base.py)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def free_ports(count):
  """Ports the OS reports free on loopback (bound together so they differ; a small race remains)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((LOOPBACK, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def cluster_spec(workers, ps=0):
  """{'chief': [...], 'worker': [...], 'ps': [...]} on free loopback ports; a chief only with parameter servers."""
  jobs = ([("chief", 1)] if ps else []) + [("worker", workers)] + ([("ps", ps)] if ps else [])
  ports = iter(free_ports(sum(n for _, n in jobs)))
  return {job: [f"{LOOPBACK}:{next(ports)}" for _ in range(n)] for job, n in jobs}


def processes_of(spec):
  return [(job, index) for job in spec for index in range(len(spec[job]))]


def preempted_code(command):
  """The exit code meaning "preempted, checkpoint saved": --config.preemption.exit_code in the command, or 143."""
  for i, arg in enumerate(command):
    if arg.startswith("--config.preemption.exit_code="):
      return int(arg.split("=", 1)[1])
    if arg == "--config.preemption.exit_code" and i + 1 < len(command):
      return int(command[i + 1])
  return PREEMPTED


# What a process prints as it dies: a glog fatal line (a failed CHECK), Python's fatal error, a C++ terminate.
_FATAL = re.compile(r"^(F\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\] .*|Fatal Python error: .*|terminate called .*)$")


class LastWords:
  """The lines of a task's output that say why it died: its first fatal line and, from the Python stack that
  faulthandler prints on a fatal signal, the innermost frame of the thread that died."""

  def __init__(self):
    self.fatal, self.frame, self._in_stack = None, None, False

  def see(self, line):
    line = line.rstrip("\n")
    if self._in_stack and self.frame is None and line.strip().startswith("File "):
      self.frame = line.strip()
    self._in_stack = line.startswith("Current thread 0x")
    if self.fatal is None and _FATAL.match(line):
      self.fatal = line

  def __str__(self):
    return "; ".join(part for part in (self.fatal, self.frame and f"in {self.frame}") if part)


def _pump(stream, prefix, out, lock, last_words=None):
  for line in iter(stream.readline, ""):
    if last_words is not None:
      last_words.see(line)
    with lock:
      out.write(f"[{prefix}] {line}" if line.endswith("\n") else f"[{prefix}] {line}\n")
      out.flush()
  stream.close()


def start_data_service(data_workers, out, lock, env=None):
  """A tf.data service dispatcher and `data_workers` workers on loopback (`python -m data.service`, the same
  interpreter); returns (grpc address, {name: process})."""
  dispatcher_port, *worker_ports = free_ports(1 + data_workers)
  base = [sys.executable, "-m", "data.service"]
  roles = [("data:dispatcher", base + ["dispatcher", f"--port={dispatcher_port}"])]
  roles += [(f"data:worker:{i}", base + ["worker", f"--dispatcher={LOOPBACK}:{dispatcher_port}", f"--port={port}"])
            for i, port in enumerate(worker_ports)]
  procs = {}
  for name, command in roles:
    procs[name] = subprocess.Popen(command, env=dict(os.environ if env is None else env), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                   preexec_fn=dying_with_this_process(signal.SIGTERM))
    with lock:
      out.write(f"[launch] {name} started (pid {procs[name].pid})\n")
    threading.Thread(target=_pump, args=(procs[name].stdout, name, out, lock), daemon=True).start()
  return f"grpc://{LOOPBACK}:{dispatcher_port}", procs


def launch(command, workers, ps=0, env=None, out=sys.stdout, poll_seconds=0.2, preempt_grace_seconds=120,
           evaluator=False, data_workers=0):
  """Runs the processes to the end; returns (exit code, name of the failed process or None).

  A task that exits with the preemption code (143 or the command's --config.preemption.exit_code: preempted
  after saving a checkpoint) gives the others preempt_grace_seconds to save and exit too; the launcher then exits
  with that code, so a wrapper script (or Kubernetes, SLURM) can tell "rerun me" from a failure. A task killed by
  a signal (a lost worker) ends the job with that code too.
  """
  preempted = preempted_code(command)
  spec = cluster_spec(workers, ps)
  lock = threading.Lock()
  service = {}
  if data_workers:
    address, service = start_data_service(data_workers, out, lock, env)
    command = [*command, f"--config.data.service={address}"]
  processes = processes_of(spec) + ([("evaluator", 0)] if evaluator else [])
  last_words = {}
  procs, pumps = _start_processes(command, spec, processes, env, out, lock, last_words)
  # The job ends when every process has ended, or (parameter servers) when the chief has: its workers wait forever.
  lead = ["chief:0"] + (["evaluator:0"] if evaluator else []) if ps else list(procs)
  failed, code = None, 0
  try:
    failed, code = _watch(procs, lead, preempted, poll_seconds, preempt_grace_seconds, service)
  except KeyboardInterrupt:
    failed, code = INTERRUPTED, 130
  finally:
    for proc in [*procs.values(), *service.values()]:
      _stop(proc)
    for pump in pumps:
      pump.join(timeout=5)
  if failed:
    with lock:
      out.write(_verdict(failed, code, preempted) + "\n")
      if code < 0 and str(last_words.get(failed, "")):
        out.write(f"[launch] {failed} died saying: {last_words[failed]}\n")
      out.flush()
    return (code if code > 0 else preempted), failed
  return 0, None


def _start_processes(command, spec, processes, env, out, lock, last_words=None):
  """({name: Popen}, [output pump threads]): one process per (job, index) with its TF_CONFIG; `last_words`, a
  dict, gets each process's LastWords."""
  procs, pumps = {}, []
  for job, index in processes:
    name = f"{job}:{index}"
    task_env = dict(os.environ if env is None else env)
    task_env["TF_CONFIG"] = json.dumps({"cluster": spec, "task": {"type": job, "index": index}})
    if "ps" in spec:
      task_env.setdefault("GRPC_FAIL_FAST", "use_caller")
    proc = subprocess.Popen(command, env=task_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # a Ctrl-C reaches the launcher, which stops the processes in order
                            preexec_fn=dying_with_this_process(signal.SIGTERM))  # and a kill -9 of it: they save
    procs[name] = proc
    with lock:
      out.write(f"[launch] {name} started (pid {proc.pid})\n")
    words = None if last_words is None else last_words.setdefault(name, LastWords())
    pump = threading.Thread(target=_pump, args=(proc.stdout, name, out, lock, words), daemon=True)
    pump.start()
    pumps.append(pump)
  return procs, pumps


def _watch(procs, lead, preempted, poll_seconds, grace_seconds, service=None):
  """Polls the processes until the lead ones have succeeded or one failed; returns (failed process or None, its code).

  A process killed by a signal (negative code) is named before the others it brought down (they exit with the
  preemption code on a lost peer). After a preemption the others get grace_seconds to save the same checkpoint.
  A process of the data service (`service`: {name: Popen}) that ends while the job runs fails the job (its processes
  would wait for its batches without a bound).
  """
  while True:
    failures = {name: proc.returncode for name, proc in procs.items() if proc.poll() not in (None, 0)}
    failures.update({name: proc.returncode or 1 for name, proc in (service or {}).items()
                     if proc.poll() is not None})
    if failures:
      failed = next((name for name, code in failures.items() if code < 0), next(iter(failures)))
      break
    if all(procs[name].poll() == 0 for name in lead):
      return None, 0
    time.sleep(poll_seconds)
  if failures[failed] == preempted:  # the others are saving the same checkpoint: let them finish before stopping
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(procs[name].poll() is None for name in lead):
      time.sleep(poll_seconds)
  return failed, failures[failed]


def signal_name(number):
  """SIGTERM for 15; "" for a signal without a name (real-time signals)."""
  try:
    return signal.Signals(number).name
  except ValueError:
    return ""


def die_with_parent(parent_pid, signum=signal.SIGKILL):
  """Has the kernel send this process `signum` when its parent ends, however it ends, kill -9 included (Linux's
  PR_SET_PDEATHSIG, kept across exec; nothing elsewhere; strictly: when the parent's thread that started this
  process ends). False when the parent is gone already (it ended before this call): the caller should exit."""
  if sys.platform.startswith("linux"):
    _libc().prctl(PR_SET_PDEATHSIG, int(signum))
  return os.getppid() == parent_pid


def dying_with_this_process(signum, then=None):
  """A preexec_fn for subprocess.Popen: the child gets `signum` when this process ends (die_with_parent), exits at
  once when this process has ended already, then runs `then()`. libc is loaded here, before the fork."""
  parent = os.getpid()
  if sys.platform.startswith("linux"):
    _libc()

  def setup():
    if not die_with_parent(parent, signum):
      os._exit(1)  # pylint: disable=protected-access
    if then is not None:
      then()

  return setup


@functools.lru_cache(maxsize=None)
def _libc():
  return ctypes.CDLL(None, use_errno=True)


INTERRUPTED = "launcher (interrupted)"


def _verdict(failed, code, preempted):
  """The launcher's one line on how the job ended."""
  if failed == INTERRUPTED:
    return ("[launch] interrupted (Ctrl-C): stopped every process with SIGTERM (each saves a checkpoint and exits); "
            "rerun the same command to resume")
  if code == preempted:
    return f"[launch] {failed} was preempted (exit code {code}, checkpoint saved); rerun to resume"
  if code < 0:
    name = signal_name(-code)
    name = f" ({name})" if name else ""
    lost = "the tf.data service lost a process" if failed.startswith("data:") else "a lost worker"
    return (f"[launch] {failed} died of signal {-code}{name}: {lost}; stopped the other processes; exit code "
            f"{preempted}: rerun to resume from the last checkpoint")
  return f"[launch] {failed} failed (exit code {code}); stopped the other processes"


def _stop(proc, grace_seconds=5):
  if proc.poll() is not None:
    return
  try:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=grace_seconds)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  except ProcessLookupError:
    pass


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m launch.local", description=__doc__.split("\n\n")[0],
      usage="python -m launch.local --workers N [--ps M] [--evaluator] -- COMMAND ...")
  parser.add_argument("--workers", type=int, required=True, help="number of worker processes (>= 1)")
  parser.add_argument("--ps", type=int, default=0, help="parameter servers (adds a chief coordinator)")
  parser.add_argument("--evaluator", action="store_true",
                      help="add a sidecar evaluator process (TF_CONFIG task type 'evaluator', outside the cluster)")
  parser.add_argument("--data_workers", type=int, default=0,
                      help="start a tf.data service with this many data workers for the train input")
  parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each process runs, after --")
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command:
    parser.error("give the command to run after --")
  if args.workers < 1 or args.ps < 0 or args.data_workers < 0:
    parser.error("--workers must be >= 1, --ps and --data_workers >= 0")
  code, _ = launch(command, args.workers, args.ps, evaluator=args.evaluator, data_workers=args.data_workers)
  return code


if __name__ == "__main__":
  sys.exit(main())
