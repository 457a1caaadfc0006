"""Preemption: on one of `preemption.signals` every task saves a checkpoint at the current step and exits with
`preemption.exit_code` (143 by default: "preempted, checkpoint saved: restart me")."""

import signal
import sys
import threading

from absl import logging
import tensorflow as tf

from errors import ConfigError


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


class PreemptionWatcher:
  """On one of `signals`: every task saves a checkpoint at the current step and exits with `exit_code`. A callback:
  it looks after each train call and any eval (`on_call_end`).

  Synchronous strategies use TensorFlow's PreemptionCheckpointHandler (it agrees on the step across workers
  through the coordination service), fed by our own signal handlers through its termination watcher (plus GCE's
  maintenance notices on GCE). Parameter-server coordinators and TPUs, which it does not cover here, get the
  equivalent: the flag is checked after each train call, then a save and exit. Checked once per train call
  (train.steps_per_loop steps), so a preempted run loses no saved work and at most one call of time.
  The default code, 143 (128 + SIGTERM), is what Kubernetes TFJob's ExitCode policy and GCE treat as "restart me".
  """

  def __init__(self, strategy, multi_worker, checkpoints, use_flag, signals="SIGTERM", exit_code=143):
    self._checkpoints, self._exit_code = checkpoints, exit_code
    self._handler = None
    self._flag = threading.Event()
    self._received = None
    self._previous = {}
    for number in signal_numbers(signals):
      self._previous[number] = signal.signal(number, self._on_signal)
    if not use_flag:
      resolver = (strategy.cluster_resolver if multi_worker
                  else tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({})))
      config = tf.distribute.experimental.TerminationConfig(
          termination_watcher_fn=_with_platform_notices(self._flag.is_set), exit_fn=self._exit, grace_period=0)
      self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
          resolver, checkpoints.manager, termination_config=config)
    self._before_exit = None

  def _on_signal(self, signum, frame):
    self._received = signal.Signals(signum).name
    self._flag.set()

  def on_call_end(self, state):
    self.save_and_exit_if_preempted(state.step, before_exit=state.writer.flush)

  def save_and_exit_if_preempted(self, step, before_exit=None):
    self._before_exit = before_exit
    if self._handler is not None:
      self._handler.save_checkpoint_if_preempted(checkpoint_number=step)
    elif self._flag.is_set():
      self._checkpoints.save(step)
      self._exit()

  def _exit(self):
    logging.warning("preempted (%s): checkpoint saved; exiting with code %d; rerun the same command to resume",
                    self._received or "by a peer or the platform", self._exit_code)
    if self._before_exit:
      self._before_exit()
    logging.flush()
    sys.exit(self._exit_code)

  def close(self):
    for number, previous in self._previous.items():
      signal.signal(number, previous)


def _with_platform_notices(watcher):
  """Adds, on GCE, TensorFlow's maintenance-event watcher (a custom watcher replaces it). The platform probe (an
  HTTP request, up to 5 s) runs once, in the handler's polling thread, not in the run's start-up."""
  from tensorflow.python.distribute.failure_handling import failure_handling_util as util
  on_gce = []

  def watch():
    if not on_gce:
      on_gce.append(util.on_gcp())
    return watcher() or (on_gce[0] and util.termination_watcher_function_gce())

  return watch
