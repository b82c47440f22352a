"""Tests of ptb/low_rank_update.py: the update from a gradient's factors."""

from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import kernels
from ptb import low_rank_update
from ptb import testing
from ptb.config import BASIC, BLOCK
from ptb_word_lm_testing import build_tiny_model


def _kernels_or_skip(test):
  if kernels.load() is None:
    test.skipTest("no kernels here: %s" % kernels.unavailable_reason())


class FactorsTest(tf.test.TestCase):

  def testSquaredNormIsTheProductsSquaredNorm(self):
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (7, 11)).astype(np.float32)
    g = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    want = np.sum((x.astype(np.float64).T @ g) ** 2)
    self.assertAllClose(self.evaluate(low_rank_update.squared_norm(x, g)),
                        want, rtol=1e-5)

  def testFactorsOnlyWhereTheUpdateCanUseThem(self):
    with mock.patch.object(kernels, "load", return_value=object()), \
        tf.Graph().as_default():
      var = tf.compat.v1.get_variable("w", [3, 5])
      var16 = tf.compat.v1.get_variable("w16", [3, 5], tf.float16)
      x, g = tf.ones([4, 3]), tf.ones([4, 5])
      few = low_rank_update.record(tf.matmul(x, g, transpose_a=True), x, g)
      self.assertIs(low_rank_update.factors(few, var)[0], x)
      rows = low_rank_update.MAX_ROWS + 1
      x_many, g_many = tf.ones([rows, 3]), tf.ones([rows, 5])
      many = low_rank_update.record(
          tf.matmul(x_many, g_many, transpose_a=True), x_many, g_many)
      cases = (("not recorded", tf.matmul(x, g, transpose_a=True), var),
               ("too many rows", many, var),
               ("float16 variable", few, var16),
               ("sparse", tf.IndexedSlices(g, tf.range(4)), var),
               ("no gradient", None, var))
      for name, gradient, variable in cases:
        self.assertIsNone(low_rank_update.factors(gradient, variable),
                          msg=name)
      with mock.patch.object(kernels, "load", return_value=None):
        self.assertIsNone(low_rank_update.factors(few, var), msg="no kernels")


class UpdateTest(tf.test.TestCase):

  def testApplySubtractsTheProductInPlace(self):
    _kernels_or_skip(self)
    rng = np.random.RandomState(1)
    w0 = rng.uniform(-1, 1, (6, 9)).astype(np.float32)
    x = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    g = rng.uniform(-1, 1, (4, 9)).astype(np.float32)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      var = tf.Variable(w0)
      update = low_rank_update.apply(var, x, g, tf.constant(0.25))
      sess.run(var.initializer)
      sess.run(update)
      self.assertAllClose(sess.run(var), w0 - 0.25 * (x.T @ g), rtol=1e-6)

  def _train(self, rnn_mode, max_rows, steps=6):
    """Costs, weights and the ops' types of `steps` steps of a tiny model."""
    config = testing.TinyConfig()
    config.num_steps, config.max_grad_norm = 3, 0.85
    rows = np.random.RandomState(5).randint(
        0, config.vocab_size, (config.batch_size, steps * 3 + 1))
    with mock.patch.object(low_rank_update, "MAX_ROWS", max_rows), \
        tf.Graph().as_default() as graph:
      model = build_tiny_model(config, rows, rnn_mode, seed=2)
      types = {op.type for op in graph.get_operations()}
      params = tf.compat.v1.trainable_variables()
      norm = tf.linalg.global_norm(tf.compat.v1.gradients(model.cost, params))
      with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  tf.compat.v1.local_variables_initializer()])
        model.assign_lr(sess, 1.0)
        runs = [sess.run([model.cost, norm, model.train_op,
                          model.update_state]) for _ in range(steps)]
        weights = sess.run(params)
    return [r[0] for r in runs], weights, types, [r[1] for r in runs]

  def testFactorsGiveTheDenseClippedUpdateOverSteps(self):
    _kernels_or_skip(self)
    for mode in (BASIC, BLOCK):
      with self.subTest(mode=mode):
        dense = self._train(mode, max_rows=0)
        factored = self._train(mode, max_rows=low_rank_update.MAX_ROWS)
        # Steps with and without clipping (max_grad_norm 0.85) both occur.
        self.assertGreater(max(dense[3]), 0.85)
        self.assertLess(min(dense[3]), 0.85)
        self.assertNotIn("ApplyOuterProduct", dense[2])
        self.assertIn("ApplyOuterProduct", factored[2])
        self.assertAllClose(factored[0], dense[0], rtol=1e-5)
        # The weights moved: the comparison is not of initial values.
        self.assertGreater(abs(dense[0][-1] - dense[0][0]), 1e-3)
        for got, want in zip(factored[1], dense[1]):
          self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
  tf.test.main()
