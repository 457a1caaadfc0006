"""Runs a sweep's trials on this machine, K at a time, each an ordinary `main.py` process in its own workdir,
pinned to its share of the CPU cores (and its own GPUs when there are GPUs).

A trial's stdout and stderr are appended to DIR/<trial>/sweep.log; each attempt (start, pid, exit code, seconds,
the `error: ...` line) is recorded in DIR/<trial>/sweep.json. A failed trial does not stop the others. SIGTERM or
Ctrl-C to the sweep forwards SIGTERM to the running trials: they save a checkpoint and exit (143); rerunning the
sweep resumes them. A sweep that ends otherwise (kill -9) takes its trials with it: the kernel sends each SIGTERM
(PR_SET_PDEATHSIG). A trial whose earlier run is still alive is waited for, not started beside it.
"""

import datetime
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from launch import local
from launch import sweep_report
from launch import sweep_study
from launch import sweep_tracking

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOP_GRACE_SECONDS = 120
# Every trial: its HParams session only; the sweep writes the one experiment (the swept keys) at its directory.
TRIAL_FLAGS = ("--config.summary.hparams_experiment=False",)
RUN_LOCK = "run.lock"  # a running main.py's workdir lock: {"host", "pid", ...} (loops/persist/workdir_lock.py)


def visible_gpus():
  """GPU ids this process may use: CUDA_VISIBLE_DEVICES when set, else `nvidia-smi -L`, else none."""
  listed = os.environ.get("CUDA_VISIBLE_DEVICES")
  if listed is not None:
    return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
  try:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
  except (OSError, subprocess.SubprocessError):
    return []
  return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def slots(parallel, cores, gpus):
  """[{'cores': [...], 'gpus': [...]}], one per concurrent trial: contiguous shares of the cores (shared round-robin
  when there are fewer cores than slots), and GPUs dealt the same way."""
  def share(items, i):
    if not items:
      return []
    if parallel >= len(items):
      return [items[i % len(items)]]
    size, extra = divmod(len(items), parallel)
    start = i * size + min(i, extra)
    return items[start:start + size + (i < extra)]
  return [{"cores": share(cores, i), "gpus": share(gpus, i)} for i in range(parallel)]


def resource_flags(slot, taken):
  """The thread flags for a slot's share (TensorFlow's pools, and the input pipeline's with GPUs); a key the user
  set (`taken`) is left alone."""
  n = max(1, len(slot["cores"]))
  flags = {"intra_op_threads": n, "inter_op_threads": n}
  if slot["gpus"]:
    flags["data.pipeline_threads"] = n
  return [f"--config.{key}={value}" for key, value in flags.items() if key not in taken]


def settings_of(config, overrides, extra_args):
  """The fingerprint of a trial's settings (config, its overrides, the flags after --): the run writes it to
  summary.json (config.sweep.settings), so the summary proves which settings it ran."""
  text = json.dumps([config, sorted(overrides.items()), list(extra_args)])
  return hashlib.sha1(text.encode()).hexdigest()[:16]


def settle(trial, sweep_dir, config, extra_args):
  """Gives a trial its workdir and its settings' fingerprint; returns it."""
  trial["workdir"] = os.path.join(sweep_dir, trial["name"])
  trial["settings"] = settings_of(config, trial["overrides"], extra_args)
  return trial


def sweep_flags(trial):
  """The trial's config.sweep.* flags: its settings' fingerprint, and its Optuna study and trial number if any;
  the sweep's tracker parent run and group (config.tracking.*) when its trials are tracked."""
  flags = [f"--config.sweep.settings={trial['settings']}"] if trial.get("settings") else []
  flags += sweep_tracking.trial_flags(os.path.dirname(trial["workdir"]))
  if trial.get("number") is not None:
    study = os.path.join(os.path.dirname(trial["workdir"]), sweep_study.STUDY_FILE)
    flags += [f"--config.sweep.study={study}", f"--config.sweep.trial={trial['number']}"]
  return flags


def trial_command(config, trial, extra_args):
  """The trial's main.py command line."""
  overrides = [f"--config.{key}={value}" for key, value in trial["overrides"].items()]
  return [sys.executable, os.path.join(REPO, "main.py"), f"--config={config}", f"--workdir={trial['workdir']}",
          *overrides, *TRIAL_FLAGS, *sweep_flags(trial), *extra_args]


def error_line(log_path, offset, code):
  """The attempt's `error: ...` line (main.py's one-line error) from its log, else what the exit code says."""
  try:
    with open(log_path, errors="replace") as f:
      f.seek(offset)
      lines = [line.strip() for line in f if line.startswith("error: ")]
  except OSError:
    lines = []
  if lines:
    return lines[-1]
  if code < 0:
    return f"killed by signal {-code} ({local.signal_name(-code) or '?'})"
  return f"exit code {code} (see {log_path})"


class Attempt:
  """One running trial process: its log, its record in sweep.json."""

  def __init__(self, trial, command, slot, out):
    self.trial, self.slot, self.command, self.stopped = trial, slot, command, False
    workdir = trial["workdir"]
    os.makedirs(workdir, exist_ok=True)
    self.log_path = os.path.join(workdir, "sweep.log")
    self.record_path = os.path.join(workdir, sweep_report.ATTEMPTS)
    log = open(self.log_path, "ab")  # pylint: disable=consider-using-with
    self.offset = log.seek(0, os.SEEK_END)
    log.write(f"=== sweep {_now()}: {' '.join(command)}\n".encode())
    log.flush()
    env = dict(os.environ)
    if slot["gpus"]:
      env["CUDA_VISIBLE_DEVICES"] = ",".join(slot["gpus"])
    cores = slot["cores"]
    # Its own process group (the sweep stops it on its way out, Ctrl-C reaches it only through the sweep), and
    # SIGTERM from the kernel when the sweep ends however it ends, kill -9 included: it saves and exits.
    self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
        command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=local.dying_with_this_process(signal.SIGTERM,
                                                 (lambda: os.sched_setaffinity(0, cores)) if cores else None))
    log.close()
    self.started = time.monotonic()
    record = sweep_report.read_json(self.record_path) or {"attempts": []}
    record["attempts"].append({"started": _now(), "pid": self.proc.pid, "exit_code": None, "seconds": None,
                               "command": command, "cores": cores, "gpus": slot["gpus"]})
    sweep_report.write_json(self.record_path, record)
    where = f"cores {','.join(map(str, cores))}" + (f", GPUs {','.join(slot['gpus'])}" if slot["gpus"] else "")
    out.write(f"[sweep] start {trial['name']} ({where}; pid {self.proc.pid}; log {self.log_path})\n")
    out.flush()

  def finish(self, out):
    """Records the ended attempt; returns its exit code (143 for the command's preemption code)."""
    code = self.proc.returncode
    if code == local.preempted_code(self.command):
      code = sweep_report.PREEMPTED
    elif code == -signal.SIGTERM and self.stopped:  # the sweep's stop came before the run could save: unfinished
      code = sweep_report.PREEMPTED
    record = sweep_report.read_json(self.record_path)
    last = record["attempts"][-1]
    last["exit_code"], last["seconds"] = self.proc.returncode, round(time.monotonic() - self.started, 1)
    last["preempted"] = code == sweep_report.PREEMPTED
    if code not in (0, sweep_report.PREEMPTED):
      last["error"] = error_line(self.log_path, self.offset, code)
    sweep_report.write_json(self.record_path, record)
    saved = self.proc.returncode != -signal.SIGTERM
    what = {0: _verdict(self.trial),
            sweep_report.PREEMPTED: "stopped with a checkpoint saved; rerun the sweep to resume" if saved else
                                    "stopped before it could save; rerun the sweep to run it"}
    verdict = what.get(code, f"failed: {last.get('error')}")
    out.write(f"[sweep] {self.trial['name']}: {verdict} ({last['seconds']} s)\n")
    out.flush()
    return code

  def stop(self):
    self.stopped = True
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass


def earlier_run(workdir):
  """The pid of a run of this trial still alive that this sweep did not start (an earlier sweep's trial: one killed
  with -9 before trials died with their sweep, or a run by hand): the workdir lock's holder on this host, or the
  last attempt in sweep.json not recorded as ended; None when there is none."""
  lock = sweep_report.read_json(os.path.join(workdir, RUN_LOCK)) or {}
  attempts = (sweep_report.read_json(os.path.join(workdir, sweep_report.ATTEMPTS)) or {}).get("attempts", [])
  pids = [lock.get("pid")] if lock.get("host") == socket.gethostname() else []
  if attempts and attempts[-1].get("exit_code") is None:
    pids.append(attempts[-1].get("pid"))
  return next((pid for pid in pids if isinstance(pid, int) and runs_in(pid, workdir)), None)


def runs_in(pid, workdir):
  """Process `pid` is alive and runs in `workdir`: its command line names it (where /proc tells: not a reused pid,
  not a zombie)."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f"--workdir={workdir}".encode() in f.read()
  except FileNotFoundError:
    return not os.path.isdir("/proc") and sweep_report.alive(pid)
  except OSError:
    return sweep_report.alive(pid)


class EarlierRun:
  """A trial's earlier run still alive (not this sweep's child): it holds a slot until it ends; then the trial
  starts (and resumes) unless that run completed it. Ctrl-C leaves it alone."""

  def __init__(self, trial, pid, slot, out):
    self.trial, self.slot, self.pid = trial, slot, pid
    out.write(f"[sweep] {trial['name']}: its earlier run (pid {pid}) is still running; waiting for it to end\n")
    out.flush()

  def poll(self):
    """None while the run is alive, else 0 (its exit code is its parent's to know)."""
    return None if runs_in(self.pid, self.trial["workdir"]) else 0

  def ended(self, out):
    """Says how the earlier run left the trial; True when it is complete."""
    complete = sweep_report.is_complete(self.trial["workdir"], self.trial.get("settings"))
    then = _verdict(self.trial) if complete else "unfinished: starting it again"
    out.write(f"[sweep] {self.trial['name']}: its earlier run ended ({then})\n")
    out.flush()
    return complete


def _now():
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _verdict(trial):
  summary = sweep_report.read_json(os.path.join(trial["workdir"], "summary.json")) or {}
  if not sweep_report.is_complete(trial["workdir"], trial.get("settings")):
    return "ended unfinished"
  return summary["stopped_early"] if str(summary.get("stopped_early", "")).startswith("pruned at") else "complete"


def run(config, trials, extra_args, parallel, out=sys.stdout, poll_seconds=0.5, more=None,
        on_end=None):
  """Runs the trials not yet complete (their summary.json proves the current settings), `parallel` at a time;
  returns 0 (all complete), 1 (some failed), or 143 (some unfinished: preempted, or the sweep stopped by
  SIGTERM/Ctrl-C; rerun to resume them). more: (count, ask): the trials of indices 0..count-1 not in `trials` come
  from ask(index) when a slot frees (an Optuna study's next trial), appended to `trials`. on_end(trial, exit code)
  after each attempt."""
  count, ask = more or (len(trials), None)
  todo = [t for t in trials if not sweep_report.is_complete(t["workdir"], t.get("settings"))]
  missing = sorted(set(range(count)) - {t["index"] for t in trials}) if ask else []
  done = len(trials) - len(todo)
  out.write(f"[sweep] {count} trials, {done} complete (skipped), {count - done} to run, {parallel} at a time\n")
  cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
  free = slots(parallel, cores, visible_gpus())
  taken = {arg.split("=", 1)[0].removeprefix("--config.") for arg in extra_args}
  running, codes = [], []
  previous = _on_sigterm(_raise_interrupt)
  try:
    while todo or missing or running:
      while (todo or missing) and free:
        if not todo:
          trials.append(ask(missing.pop(0)))
          todo.append(trials[-1])
        running.append(_start(config, todo.pop(0), free.pop(0), taken, extra_args, out))
      time.sleep(poll_seconds)
      for attempt in [a for a in running if _poll(a) is not None]:
        running.remove(attempt)
        free.append(attempt.slot)
        if isinstance(attempt, EarlierRun):
          if not attempt.ended(out):
            todo.insert(0, attempt.trial)
          continue
        codes.append(attempt.finish(out))
        if on_end:
          on_end(attempt.trial, codes[-1])
  except KeyboardInterrupt:
    _stop_all([a for a in running if isinstance(a, Attempt)], out)
    return sweep_report.PREEMPTED
  except Exception:  # e.g. the study refused a trial's values: the running trials save and stop
    _stop_all([a for a in running if isinstance(a, Attempt)], out)
    raise
  finally:
    _on_sigterm(previous)
  if any(code not in (0, sweep_report.PREEMPTED) for code in codes):
    return 1
  complete = all(sweep_report.is_complete(t["workdir"], t.get("settings")) for t in trials)
  return 0 if complete else sweep_report.PREEMPTED


def _start(config, trial, slot, taken, extra_args, out):
  """The trial's attempt in this slot; or its earlier run, when one is still alive, to wait for."""
  pid = earlier_run(trial["workdir"])
  if pid is not None:
    return EarlierRun(trial, pid, slot, out)
  command = trial_command(config, trial, resource_flags(slot, taken | set(trial["overrides"])) + extra_args)
  return Attempt(trial, command, slot, out)


def _poll(running):
  return running.poll() if isinstance(running, EarlierRun) else running.proc.poll()


def _on_sigterm(handler):
  """Sets the SIGTERM handler (the main thread only; elsewhere the caller's stays); returns the previous one."""
  if threading.current_thread() is not threading.main_thread():
    return handler
  return signal.signal(signal.SIGTERM, handler)


def _raise_interrupt(signum, frame):
  raise KeyboardInterrupt


def _stop_all(running, out):
  """SIGTERM to every running trial, then waits (STOP_GRACE_SECONDS) for their checkpoints."""
  out.write(f"[sweep] stopping: SIGTERM to {len(running)} running trial(s); they save a checkpoint\n")
  for attempt in running:
    attempt.stop()
  deadline = time.monotonic() + STOP_GRACE_SECONDS
  try:
    for attempt in running:
      try:
        attempt.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        os.killpg(attempt.proc.pid, signal.SIGKILL)
        attempt.proc.wait()
  except KeyboardInterrupt:  # a second Ctrl-C (or SIGTERM): stop at once
    out.write("[sweep] interrupted again: killing the trials still saving (they resume from their last checkpoint)\n")
    for attempt in running:
      if attempt.proc.poll() is None:
        os.killpg(attempt.proc.pid, signal.SIGKILL)
      attempt.proc.wait()
  for attempt in running:
    attempt.finish(out)
