"""Tests of ptb/transposed_product.py: a @ w^T, plain or swapped.

Where each form is used is the plan's choice (plan_test.py).
"""

import numpy as np
import tensorflow as tf

from ptb import transposed_product


class MatmulTransposedTest(tf.test.TestCase):

  def testBothFormsGiveTheProduct(self):
    rng = np.random.RandomState(3)
    a = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    w = rng.uniform(-1, 1, (5, 13)).astype(np.float32)
    for swapped in (True, False):
      with self.subTest(swapped=swapped), tf.Graph().as_default():
        product = transposed_product.matmul_transposed(
            tf.constant(a), tf.constant(w), swapped)
        self.assertEqual(product.shape.as_list(), [7, 5])
        types = {op.type for op in tf.compat.v1.get_default_graph()
                 .get_operations()}
        self.assertEqual("Transpose" in types, swapped)
        with tf.compat.v1.Session() as sess:
          self.assertAllClose(sess.run(product), a @ w.T, rtol=1e-6)

  def testShapeWithUnknownRows(self):
    with tf.Graph().as_default():
      a = tf.compat.v1.placeholder(tf.float32, [None, 10000])
      w = tf.compat.v1.placeholder(tf.float32, [1000, 10000])
      for swapped in (True, False):
        self.assertEqual(
            transposed_product.matmul_transposed(a, w, swapped).shape
            .as_list(), [None, 1000])


if __name__ == "__main__":
  tf.test.main()
