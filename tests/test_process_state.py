"""tests/conftest.py's autouse fixture gives every test the process-wide state the previous one found: the first
test changes all of it, the next sees it as it was."""

import os
import signal

import keras
import tensorflow as tf

from loops import private_apis
from loops.persist import preemption
from tests import conftest

FOUND = {}
PIPES = []  # the first test's wakeup pipe, closed by the next once the fixture has put the old fd back


def change_everything():
  if private_apis.op_determinism_enabled():
    private_apis.disable_op_determinism()
  else:
    tf.config.experimental.enable_op_determinism()
  folding = tf.config.optimizer.get_experimental_options().get("constant_folding", True)
  tf.config.optimizer.set_experimental_options({"constant_folding": not folding})
  keras.mixed_precision.set_dtype_policy("mixed_float16")
  signal.signal(signal.SIGUSR1, lambda *_: None)
  read, write = os.pipe()
  os.set_blocking(write, False)
  signal.set_wakeup_fd(write)
  preemption.PROCESS_ENDS_AFTER_RUN = not preemption.PROCESS_ENDS_AFTER_RUN
  preemption.SIGNAL_LISTENERS.append(print)
  preemption.RECEIVED.append("SIGTERM")
  return read, write


def test_a_test_changes_the_process_wide_state():
  FOUND.update(conftest.process_state())
  PIPES.extend(change_everything())
  changed = conftest.process_state()
  assert all(changed[key] != FOUND[key] for key in FOUND), {k: (FOUND[k], changed[k]) for k in FOUND}


def test_the_next_test_finds_it_as_it_was():
  assert FOUND, "runs after test_a_test_changes_the_process_wide_state"
  assert conftest.process_state() == FOUND
  for fd in PIPES:
    os.close(fd)


def test_restore_process_state_undoes_each_change():
  saved = conftest.process_state()
  read, write = change_everything()
  conftest.restore_process_state(saved)
  assert conftest.process_state() == saved
  os.close(read)
  os.close(write)
