"""Tests of the softmax layer's loss and its hand-written gradient."""

import numpy as np
import tensorflow as tf

from ptb import kernels
from ptb import softmax


class SoftmaxLossTest(tf.test.TestCase):

  def _check(self, inputs, w, b, labels, d_loss):
    """Both paths of softmax_loss against TensorFlow's; their losses."""
    paths = [softmax.softmax_loss_ops]
    # The kernel's path where it can run (lstm_kernels_test compares the
    # two paths directly too).
    if kernels.load() is not None:
      paths.append(softmax.softmax_loss_fused)
    losses = []
    for path in paths:
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        args = [tf.constant(v) for v in (inputs, w, b)]
        ours = path(*args, tf.constant(labels))
        theirs = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(args[0], args[1]) + args[2])
        grads = [tf.compat.v1.gradients(loss * d_loss, args)
                 for loss in (ours, theirs)]
        got, want, g_got, g_want = sess.run([ours, theirs] + grads)
      self.assertAllClose(got, want, rtol=1e-6, atol=1e-5, msg=path.__name__)
      for g, w_ in zip(g_got, g_want):
        self.assertAllClose(g, w_, rtol=1e-5, atol=1e-6, msg=path.__name__)
      losses.append(got)
    return losses

  def testMatchesTensorFlowLossAndGradients(self):
    rng = np.random.RandomState(4)
    inputs = rng.uniform(-3, 3, size=(7, 5)).astype(np.float32)
    w = rng.uniform(-2, 2, size=(5, 11)).astype(np.float32)
    b = rng.uniform(-1, 1, size=11).astype(np.float32)
    labels = rng.randint(0, 11, size=7).astype(np.int32)
    d_loss = rng.uniform(0, 2, size=7).astype(np.float32)
    self._check(inputs, w, b, labels, d_loss)

  def testTargetProbabilityBelowFloatRangeGivesTheExactLoss(self):
    # Row 1's target logit is 200 below the others: its probability, e^-200,
    # is 0 in float32, and -log(p) would be inf. The loss must be 200.
    inputs = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    w = np.array([[0.5, 0.0, 0.0], [0.0, 0.0, -200.0]], np.float32)
    b = np.zeros(3, np.float32)
    labels = np.array([0, 2], np.int32)
    for got in self._check(inputs, w, b, labels, np.ones(2, np.float32)):
      self.assertAllClose(got[1], 200.0 + np.log(2.0), rtol=1e-6)
      self.assertAllClose(
          got[0], np.log(np.exp(0.5) + 2.0) - 0.5, rtol=1e-6)


if __name__ == "__main__":
  tf.test.main()
