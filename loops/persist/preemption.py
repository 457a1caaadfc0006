"""Preemption: on one of `preemption.signals` every process saves a checkpoint at the current step and exits with
`preemption.exit_code` (143 by default: "preempted, checkpoint saved: restart me")."""

import os
import select
import signal
import sys
import threading

from absl import logging
import tensorflow as tf

from errors import ConfigError
from loops import private_apis


def signal_numbers(names):
  """'SIGTERM,SIGUSR1' -> [signal.SIGTERM, signal.SIGUSR1]; raises ConfigError naming an unknown name."""
  numbers = []
  for name in (n.strip().upper() for n in names.split(",")):
    if not name.startswith("SIG"):
      name = "SIG" + name
    if name not in CATCHABLE_SIGNALS:
      raise ConfigError(f"preemption.signals: unknown or uncatchable signal '{name}'; valid: "
                        f"{', '.join(CATCHABLE_SIGNALS)} (comma-separated)")
    numbers.append(signal.Signals[name])
  return numbers


CATCHABLE_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGCONT")


INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report for Ctrl-C
# main.py sets True: the process ends after its one run, so signals that come after the run (a scheduler's late
# warning, a second Ctrl-C) are ignored once the watcher closes, instead of killing a finished run.
PROCESS_ENDS_AFTER_RUN = False
# Called with the signal's name for every signal a watcher receives (e.g. service_watch: a wait that never ends).
SIGNAL_LISTENERS = []
# The names of the signals the current watcher received, in order: a listener that starts later (service_watch, at
# the next train call) still learns of a signal that came between calls.
RECEIVED = []


class PreemptionWatcher:
  """On one of `signals`: every process saves a checkpoint at the current step and exits with `exit_code`. A callback:
  it looks after each train call and any eval (`on_call_end`).

  Synchronous strategies use TensorFlow's PreemptionCheckpointHandler (it agrees on the step across workers
  through the coordination service), fed by our own signal handlers through its termination watcher (plus GCE's
  maintenance notices on GCE). The handler restores the latest checkpoint when it is made, so a watcher is made
  only inside the restore order, by `Checkpoints.restore_run` (loops/persist/checkpoints.py). Parameter-server coordinators and TPUs, which it does not cover here, get the
  equivalent: the flag is checked after each train call, then a save and exit. Checked once per train call
  (train.steps_per_loop steps), so a preempted run loses no saved work and at most one call of time.
  The default code, 143 (128 + SIGTERM), is what Kubernetes TFJob's ExitCode policy and GCE treat as "restart me".

  Ctrl-C (SIGINT, unless it is one of `signals`) is the same with exit code 130; a second Ctrl-C exits at once.
  Signals are read by a thread (signal.set_wakeup_fd), so they are seen while a train call runs inside TensorFlow.
  A signal after the last step changes nothing: the run finishes and saves as it would have.
  """

  def __init__(self, strategy, multi_worker, checkpoints, use_flag, signals="SIGTERM", exit_code=143):
    self._checkpoints, self._exit_code, self._multi_worker = checkpoints, exit_code, multi_worker
    self._handler = None
    RECEIVED.clear()  # this run's signals only
    self._flag = threading.Event()
    self._received = None
    self._finished = False
    self._interrupts = 0
    numbers = signal_numbers(signals)
    self._ctrl_c = signal.SIGINT not in numbers
    self._previous = {number: signal.signal(number, _noop) for number in {*numbers, signal.SIGINT}}
    self._wakeup = _SignalReader(self._on_signal)
    if not use_flag:
      resolver = (strategy.cluster_resolver if multi_worker
                  else tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({})))
      config = tf.distribute.experimental.TerminationConfig(
          termination_watcher_fn=_with_platform_notices(self._flag.is_set), exit_fn=self._exit, grace_period=0)
      self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
          resolver, checkpoints.manager, termination_config=config)
    self._before_exit = None

  def _on_signal(self, number):
    """In the reader thread, for every signal received."""
    name = signal.Signals(number).name
    RECEIVED.append(name)
    for listener in list(SIGNAL_LISTENERS):
      listener(name)
    interrupt = number == signal.SIGINT and self._ctrl_c
    self._interrupts += interrupt
    if self._interrupts > 1:
      _hard_exit("second Ctrl-C: exiting at once (the last saved checkpoint stays; rerun the same command to resume "
                 "from it)", INTERRUPTED_EXIT_CODE)
    if self._finished:
      logging.warning("%s after the last step: the run finishes as it would have%s", name,
                      " (Ctrl-C again to exit at once)" if interrupt else "")
      return
    if interrupt:
      logging.warning("Ctrl-C: saving a checkpoint at the end of this train call, then exiting (Ctrl-C again to exit "
                      "at once)")
    if not self._flag.is_set():
      self._received = name
      self._flag.set()

  def on_call_end(self, state):
    if state.step >= state.total_steps:  # training is done: the final checkpoint and summary follow anyway
      self._finished = True
      if self._flag.is_set():
        logging.warning("%s during the last train call: the run finishes as it would have", self._received)
      return
    self.save_and_exit_if_preempted(state.step, before_exit=state.writer.flush)

  def on_train_end(self, state):
    self._finished = True

  def save_and_exit_if_preempted(self, step, before_exit=None):
    self._before_exit = before_exit
    if self._handler is not None and (self._multi_worker or not self._flag.is_set()):
      # several workers agree on the step through the handler (it polls the flag about once a second)
      # with asynchronous options TensorFlow waits for pending writes, then saves this one blocking
      self._handler.save_checkpoint_if_preempted(checkpoint_number=step, options=self._checkpoints.save_options())
    elif self._flag.is_set():
      self._checkpoints.save(step, wait=True)
      self._exit()

  def _exit(self):
    if self._received == "SIGINT" and self._ctrl_c:
      code, cause = INTERRUPTED_EXIT_CODE, "interrupted (Ctrl-C)"
    else:
      code, cause = self._exit_code, f"preempted ({self._received or 'by a peer or the platform'})"
    self._checkpoints.wait()  # no asynchronous write is left pending at exit
    logging.warning("%s: checkpoint saved; exiting with code %d; rerun the same command to resume from %s", cause,
                    code, self._checkpoints.latest())
    if self._before_exit:
      self._before_exit()
    logging.flush()
    sys.exit(code)

  def close(self):
    self._finished = True
    self._wakeup.close()
    for number, previous in self._previous.items():
      signal.signal(number, signal.SIG_IGN if PROCESS_ENDS_AFTER_RUN else previous)


def _noop(*_):
  """A Python-level handler, so that the interpreter's C handler writes the signal to the wakeup fd."""


def _hard_exit(message, code):
  sys.stderr.write(f"{message}\n")
  sys.stderr.flush()
  os._exit(code)  # the main thread may be inside a TensorFlow call that Python cannot interrupt


class _SignalReader:
  """Calls on_signal(number) from a thread for each signal the process receives (signal.set_wakeup_fd)."""

  def __init__(self, on_signal):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._on_signal, self._closed = on_signal, threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name="signal-reader")
    self._thread.start()

  def _run(self):
    while not self._closed.is_set():
      ready, _, _ = select.select([self._read], [], [], 0.2)
      if ready and not self._closed.is_set():
        for number in os.read(self._read, 64):
          self._on_signal(number)

  def close(self):
    self._closed.set()
    signal.set_wakeup_fd(self._previous_fd)
    self._thread.join()
    os.close(self._read)
    os.close(self._write)


def _with_platform_notices(watcher):
  """Adds, on GCE, TensorFlow's maintenance-event watcher (a custom watcher replaces it). The platform probe (an
  HTTP request, up to 5 s) runs once, in the handler's polling thread, not in the run's start-up."""
  on_gce = []

  def watch():
    if not on_gce:
      on_gce.append(private_apis.on_gce())
    return watcher() or (on_gce[0] and private_apis.gce_maintenance_notice())

  return watch
