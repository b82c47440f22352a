"""Tests of ptb/original_norm.py: TensorFlow 1.5.1's clipping norm in the port.

Its float32 sums against TensorFlow 1.5.1 itself are compare_original_test's
(SumAsTf15Test, GlobalNormAsTf15Test, where the original's virtualenv
exists); here what the norm sums, and the update that uses it.
"""

from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import errors
from ptb import kernels
from ptb import kernels_test
from ptb import original_norm
from ptb.low_rank_update import LowRankGradient
import util


def _norm(grads_and_vars, threads=2):
  return float(original_norm.global_norm(grads_and_vars, threads).numpy())


class GlobalNormTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    kernels_test.library_or_skip(self)
    self.rng = np.random.RandomState(5)

  def testSmallGradientsGiveTheExactNorm(self):
    # A few values: every sum in order, as exact as float32 allows.
    values = [self.rng.uniform(-1, 1, shape).astype(np.float32)
              for shape in ((3, 4), (5,), (2, 7))]
    pairs = [(tf.constant(v), tf.Variable(v)) for v in values]
    exact = np.sqrt(sum(np.sum(v.astype(np.float64) ** 2) for v in values))
    self.assertAllClose(_norm(pairs), exact, rtol=1e-6)

  def testIndexedSlicesCountEachRowGiven(self):
    # tf.global_norm took an IndexedSlices' values: a repeated row counts
    # twice, where the dense gradient would hold the rows' sum.
    rows = self.rng.uniform(-1, 1, (2, 6)).astype(np.float32)
    values = np.concatenate([rows, rows[:1]])
    var = tf.Variable(np.zeros((4, 6), np.float32))
    slices = tf.IndexedSlices(tf.constant(values), tf.constant([1, 3, 1]),
                              tf.constant([4, 6]))
    self.assertAllClose(_norm([(slices, var)]),
                        np.sqrt(np.sum(values.astype(np.float64) ** 2)),
                        rtol=1e-6)

  def testLowRankGradientIsFormed(self):
    x = self.rng.uniform(-1, 1, (9, 5)).astype(np.float32)
    g = self.rng.uniform(-1, 1, (9, 16)).astype(np.float32)
    var = tf.Variable(np.zeros((5, 16), np.float32))
    self.assertEqual(_norm([(LowRankGradient(x, g), var)]),
                     _norm([(tf.constant(x.T @ g), var)]))

  def testLargeGradientSumsInLanes(self):
    # Small's softmax weight: 8 lanes of 250,000 values each, summed in
    # float32, fall below the exact sum by far more than one rounding.
    grad = (self.rng.uniform(-1, 1, (200, 10000)) * 0.01).astype(np.float32)
    var = tf.Variable(np.zeros_like(grad))
    exact = np.sqrt(np.sum(grad.astype(np.float64) ** 2))
    got = _norm([(tf.constant(grad), var)])
    self.assertGreater(abs(got - exact) / exact, 1e-6)
    self.assertAllClose(got, exact, rtol=1e-3)
    # The threads change the blocks, so the sum.
    self.assertNotEqual(got, _norm([(tf.constant(grad), var)], threads=1))


class ClippedUpdateTest(tf.test.TestCase):

  def testUpdateClipsByTheOriginalsNorm(self):
    kernels_test.library_or_skip(self)
    rng = np.random.RandomState(6)
    grad = (rng.uniform(-1, 1, (200, 10000)) * 0.01).astype(np.float32)
    start = np.zeros_like(grad)  # the update itself, rounded once
    lr, max_norm = 0.5, 1.0
    moved = {}
    for threads in (0, 2):
      with tf.Graph().as_default():
        var = tf.compat.v1.Variable(start)
        update = util.train_op([[tf.constant(grad)]], [var],
                               tf.constant(lr), max_norm,
                               norm_threads=threads)
        with self.session() as session:
          session.run(tf.compat.v1.global_variables_initializer())
          session.run(update)
          moved[threads] = start - session.run(var)
    norm = _norm([(tf.constant(grad), tf.Variable(grad))])
    self.assertAllClose(moved[2], lr * max_norm / norm * grad, rtol=1e-4,
                        atol=1e-7)
    # The same step, longer by the ratio of the norms.
    ratio = (np.sum(moved[2].astype(np.float64) * grad) /
             np.sum(moved[0].astype(np.float64) * grad))
    exact = np.sqrt(np.sum(grad.astype(np.float64) ** 2))
    self.assertAllClose(ratio, exact / norm, rtol=2e-6)
    self.assertNotAllClose(ratio, 1.0, rtol=1e-6, atol=0)


class CheckTest(tf.test.TestCase):

  def testRefusals(self):
    original_norm.check(0, True)  # off: nothing to refuse
    with self.assertRaisesRegex(errors.UserError, "cannot run with "
                                "--use_fp16"):
      original_norm.check(2, True)
    with mock.patch.object(kernels, "load_library",
                           side_effect=RuntimeError("no g++ found")), \
        self.assertRaisesRegex(errors.UserError,
                               "needs the kernels' op library.*no g\\+\\+"):
      original_norm.check(2, False)


if __name__ == "__main__":
  tf.test.main()
