"""Tests of ptb/transposed_product.py: a @ w^T, swapped where it pays."""

from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import transposed_product


def _placeholders(rows, weight_shape, device="/cpu:0"):
  with tf.device(device):
    a = tf.compat.v1.placeholder(tf.float32, [rows, weight_shape[1]])
  return a, tf.compat.v1.placeholder(tf.float32, weight_shape)


class MatmulTransposedTest(tf.test.TestCase):

  def testBothFormsGiveTheProduct(self):
    rng = np.random.RandomState(3)
    a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    w = rng.uniform(-1, 1, (5, 13)).astype(np.float32)
    for min_weight, swap in ((0, True), (10**9, False)):
      with self.subTest(swap=swap), tf.Graph().as_default(), \
          mock.patch.object(transposed_product, "MIN_WEIGHT", min_weight):
        a_t, w_t = tf.constant(a), tf.constant(w)
        self.assertEqual(transposed_product.swapped(a_t, w_t), swap)
        product = transposed_product.matmul_transposed(a_t, w_t)
        self.assertEqual(product.shape.as_list(), [7, 5])
        with tf.compat.v1.Session() as sess:
          self.assertAllClose(sess.run(product), a @ w.T, rtol=1e-6)

  def testTheModelsShapes(self):
    # (rows, weight): the how-to's class's softmax layer and input
    # gradients; medium's input gradients in chunks of 4 steps; small's
    # (its weight fits in the caches); every default softmax layer.
    cases = [(40, [1000, 10000], True), (40, [1000, 4000], True),
             (20, [1000, 4000], True), (80, [650, 2600], True),
             (80, [200, 800], False), (400, [200, 10000], False),
             (700, [650, 10000], False), (129, [1000, 4000], False)]
    for rows, weight, swap in cases:
      with self.subTest(rows=rows, weight=weight), tf.Graph().as_default():
        a, w = _placeholders(rows, weight)
        self.assertEqual(transposed_product.swapped(a, w), swap)

  def testPlainOnGpusAndForUnknownRows(self):
    with tf.Graph().as_default():
      a, w = _placeholders(40, [1000, 10000], device="/gpu:0")
      self.assertFalse(transposed_product.swapped(a, w))
      a, w = _placeholders(None, [1000, 10000])
      self.assertFalse(transposed_product.swapped(a, w))
      self.assertEqual(
          transposed_product.matmul_transposed(a, w).shape.as_list(),
          [None, 1000])


if __name__ == "__main__":
  tf.test.main()
