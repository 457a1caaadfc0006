"""Every process the tests start imports Keras and TensorFlow as if pandas, matplotlib, scikit-learn and SciPy were
not installed (conftest.py puts this folder on PYTHONPATH).

Keras 3 imports them at `import keras` for integrations the framework never uses (pandas inputs to fit, plotting
galleries, scikit-learn wrappers, SciPy sparse inputs to TensorFlow's legacy Keras), each import guarded by
`except ImportError`: about 3 of the 9-10 s of CPU a fresh `import main` costs here, paid by ~190 worker, trial and
check processes in a run of the suite. Only imports made by keras/tensorflow modules are refused; the framework's own
(scikit-learn's digits, MLflow's pandas) import them as usual. A user's install without these packages runs the same.
"""

import os
import sys

OPTIONAL = frozenset({"pandas", "matplotlib", "sklearn", "scipy"})
REFUSED_FOR = ("keras", "tensorflow")
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib")


class KerasOptionalImportsAbsent:
  """A sys.meta_path finder: an import of an OPTIONAL package from a REFUSED_FOR module raises ImportError."""

  def find_spec(self, name, path=None, target=None):
    if name.partition(".")[0] not in OPTIONAL:
      return None
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(_IMPORT_MACHINERY):
      frame = frame.f_back
    importer = frame.f_globals.get("__name__", "") if frame is not None else ""
    if importer.partition(".")[0] in REFUSED_FOR:
      raise ImportError(f"{name} is not imported for {importer} in the tests' processes (tests/child_site)")
    return None


sys.meta_path.insert(0, KerasOptionalImportsAbsent())

if os.environ.get("TESTS_PROCESS_LOG"):  # this process's CPU logged at its exit (see process_log.py)
  import process_log

  process_log.log_this_process()

if os.environ.get("TESTS_FORK_SERVER"):  # a python main.py ...: run by tests/fixtures/forks.py (see forked.py)
  import forked

  forked.run_forked()
