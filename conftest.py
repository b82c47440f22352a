"""pytest settings shared by every test file."""

from ptb import onednn

# The tests run the matmuls the programs run: oneDNN's, on every x86 CPU
# (ptb/onednn.py). This file is read before any test imports TensorFlow.
onednn.enable()


def pytest_collection_modifyitems(items):
  # tf.test.TestCase has a helper named test_session, which pytest collects
  # as a test and reports as skipped ("Not a test."): it is not one.
  items[:] = [item for item in items if item.name != "test_session"]
