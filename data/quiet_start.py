"""A command line's quiet start: TensorFlow's C++ start-up chatter (CUDA probing on a CPU machine, oneDNN notes,
"All log messages before absl::InitializeLog") kept off the console of main.py, `python -m data.prepare` and
`python -m data.service`; --debug shows all of it, and a TF_CPP_MIN_LOG_LEVEL the user set wins. Standard library
only: it runs before TensorFlow is imported."""

import os
import re
import sys
import tempfile

STARTUP_NOISE = re.compile(r"^(I\d{4} |WARNING: All log messages before absl::InitializeLog|To enable the following "
                           r"instructions|.*rebuild TensorFlow with the appropriate compiler flags)")


def for_a_command_line():
  """Unless --debug is on the command line: TensorFlow's C++ logging from errors up, and TensorFlow imported with
  its start-up lines filtered. Returns whether it is quiet."""
  if "--debug" in sys.argv:
    return False
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  import_tensorflow_quietly()
  return True


def import_tensorflow_quietly():
  """Imports TensorFlow with the C++ lines it prints before logging is set up filtered (others are replayed)."""
  saved = os.dup(2)
  with tempfile.TemporaryFile() as capture:
    os.dup2(capture.fileno(), 2)
    try:
      import tensorflow  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      for line in capture.read().decode(errors="replace").splitlines(keepends=True):
        if not STARTUP_NOISE.match(line):
          sys.stderr.write(line)
