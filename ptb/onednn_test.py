"""Tests of ptb/onednn.py."""

import os
from unittest import mock

from absl.testing import absltest

from ptb import onednn


class OneDnnTest(absltest.TestCase):

  def testTurnsOneDnnOnUnlessTheEnvironmentSaysOtherwise(self):
    with mock.patch.dict(os.environ):
      os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)
      self.assertTrue(onednn.enable())
      self.assertEqual(os.environ["TF_ENABLE_ONEDNN_OPTS"], "1")
      os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
      self.assertFalse(onednn.enable())
      self.assertEqual(os.environ["TF_ENABLE_ONEDNN_OPTS"], "0")

  def testOnInTheTestsProcess(self):
    # conftest.py enabled it before TensorFlow was imported, as the entry
    # points do, and TensorFlow's x86 wheels carry oneDNN.
    self.assertTrue(onednn.enabled())


if __name__ == "__main__":
  absltest.main()
