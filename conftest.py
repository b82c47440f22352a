"""pytest settings shared by every test file."""

import os
import shutil
import tempfile

from ptb import onednn

# The tests run the matmuls the programs run: oneDNN's, on every x86 CPU
# (ptb/onednn.py). This file is read before any test imports TensorFlow.
onednn.enable()


def pytest_collection_modifyitems(items):
  # tf.test.TestCase has a helper named test_session, which pytest collects
  # as a test and reports as skipped ("Not a test."): it is not one.
  items[:] = [item for item in items if item.name != "test_session"]


# The kernels are built once per pytest run, into a directory of the run's
# own (never the user's cache): every test, and every process a test starts,
# finds them there. Only the tests of a fresh build build elsewhere.
if "PTB_KERNEL_DIR" not in os.environ:
  os.environ["PTB_KERNEL_DIR"] = tempfile.mkdtemp(prefix="ptb_kernels_test_")
  _OWN_KERNEL_DIR = os.environ["PTB_KERNEL_DIR"]
else:
  _OWN_KERNEL_DIR = None


def pytest_unconfigure(config):
  del config
  if _OWN_KERNEL_DIR:
    shutil.rmtree(_OWN_KERNEL_DIR, ignore_errors=True)
