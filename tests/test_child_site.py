"""tests/child_site: the processes the tests start skip Keras' optional imports, and only those."""

import os
import subprocess
import sys

import pytest
from tests.conftest import CHILD_SITE, REPO

PROBE = """
import sys
import keras, tensorflow
skipped = sorted(name for name in ("pandas", "matplotlib", "sklearn", "scipy") if name in sys.modules)
from keras.src.trainers.data_adapters import array_slicing
import sklearn.datasets
print(skipped, array_slicing.pandas, sklearn.datasets.load_digits().data.shape, "scipy" in sys.modules)
"""


@pytest.mark.e2e  # starts a process that imports TensorFlow (8 s)
@pytest.mark.skipif(os.environ.get("TESTS_CHILD_SITE") == "0", reason="TESTS_CHILD_SITE=0 turned it off")
def test_a_child_imports_keras_without_its_optional_packages_and_the_framework_still_imports_them():
  assert CHILD_SITE in os.environ["PYTHONPATH"].split(os.pathsep)  # what every child of the tests inherits
  done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split("\n")[-2] == "[] None (1797, 64) True", done.stdout
