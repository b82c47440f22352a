"""Tests of ptb/onednn.py."""

import os
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from ptb import onednn


def _matmul_kernel():
  """The op type that ran a graph's MatMul in this process (from a trace)."""
  graph = tf.Graph()
  with graph.as_default():
    a = tf.compat.v1.placeholder(tf.float32, [64, 64])
    product = tf.matmul(a, a)
    with tf.compat.v1.Session() as session:
      metadata = tf.compat.v1.RunMetadata()
      session.run(product, {a: np.ones([64, 64], np.float32)},
                  options=tf.compat.v1.RunOptions(
                      trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                  run_metadata=metadata)
  # Labels read "node = OpType(inputs)".
  labels = [n.timeline_label for d in metadata.step_stats.dev_stats
            for n in d.node_stats if n.node_name == product.op.name]
  return labels[0].split("=")[1].split("(")[0].strip()


class OneDnnTest(absltest.TestCase):

  def testTurnsOneDnnOnUnlessTheEnvironmentSaysOtherwise(self):
    with mock.patch.dict(os.environ):
      os.environ.pop("TF_ENABLE_ONEDNN_OPTS", None)
      self.assertTrue(onednn.enable())
      self.assertEqual(os.environ["TF_ENABLE_ONEDNN_OPTS"], "1")
      os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
      self.assertFalse(onednn.enable())
      self.assertEqual(os.environ["TF_ENABLE_ONEDNN_OPTS"], "0")

  def testTheTestsMatmulsRunOnOneDnn(self):
    # conftest.py enabled it before TensorFlow was imported, as the entry
    # points do: TensorFlow rewrites MatMul into oneDNN's op (Eigen's would
    # run as MatMul).
    self.assertTrue(onednn.enabled())
    self.assertEqual(onednn.matmul_library(), "onednn")
    self.assertEqual(_matmul_kernel(), "_MklMatMul")


if __name__ == "__main__":
  absltest.main()
