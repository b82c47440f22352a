"""Tests of ptb/low_rank_update.py: gradients carried and applied as factors."""

import dataclasses

import numpy as np
import tensorflow as tf

from ptb import devices as devices_lib
from ptb import low_rank_update
from ptb import lstm
from ptb import plan as plan_lib
from ptb import softmax
from ptb import testing
from ptb.config import BASIC, BLOCK
from ptb.low_rank_update import LowRankGradient
from ptb.state import LSTMStateTuple
from ptb_word_lm_testing import build_tiny_model
from ptb_word_lm_testing import training_plan


def _kernels_or_skip(test):
  """The kernels' width here; skips where they are not offered."""
  offered = plan_lib.offered()
  if offered.isa is None:
    test.skipTest("no kernels here: %s" % offered.why)
  return offered.isa


class FactorsTest(tf.test.TestCase):

  def testSquaredNormIsTheProductsSquaredNorm(self):
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (7, 11)).astype(np.float32)
    g = rng.uniform(-1, 1, (7, 13)).astype(np.float32)
    want = np.sum((x.astype(np.float64).T @ g) ** 2)
    self.assertAllClose(
        self.evaluate(low_rank_update.squared_norm(LowRankGradient(x, g))),
        want, rtol=1e-5)

  def testTowersAverageIsTheProductOfTheirRows(self):
    rng = np.random.RandomState(2)
    pairs = [LowRankGradient(rng.uniform(-1, 1, (m, 3)).astype(np.float32),
                             rng.uniform(-1, 1, (m, 5)).astype(np.float32))
             for m in (4, 6)]
    average = low_rank_update.average(pairs)
    self.assertIsInstance(average, LowRankGradient)
    want = sum(x.T @ g for x, g in pairs) / 2
    self.assertAllClose(self.evaluate(low_rank_update.dense(average, [3, 5])),
                        want, rtol=1e-6)

  def testTheBackwardPassHandsOutEachWeightsFactors(self):
    rng = np.random.RandomState(3)
    steps, batch, size, vocab = 3, 4, 5, 7
    u = lambda *s: tf.constant(rng.uniform(-1, 1, s).astype(np.float32))
    for chunk in (2, None):
      limits = testing.wavefront_limits(chunk, size)
      with self.subTest(chunk=chunk), tf.Graph().as_default(), \
          tf.compat.v1.Session() as sess:
        x = u(steps, batch, size)
        kernels_ = [u(2 * size, 4 * size) for _ in range(2)]
        biases = [u(4 * size) for _ in range(2)]
        states = [LSTMStateTuple(u(batch, size), u(batch, size))] * 2
        w, b = u(size, vocab), u(vocab)
        factors = {}
        outputs, _ = lstm.lstm_stack(
            plan_lib.lstm(BASIC, 2, size, batch, steps, limits=limits), x,
            states, kernels_, biases, factors=factors)
        loss = softmax.softmax_loss(
            plan_lib.Softmax(plan_lib.OPS, plan_lib.PLAIN, None),
            tf.reshape(outputs, [-1, size]), w, b,
            tf.constant(rng.randint(0, vocab, steps * batch), tf.int32),
            factors)
        weights = kernels_ + [w, b]
        grads = tf.compat.v1.gradients(loss, weights)
        self.assertLen(factors, 4)
        formed = [low_rank_update.dense(factors[v.ref()], v.shape)
                  for v in weights]
        got, want = sess.run([formed, grads])
        for k, (g, w_) in enumerate(zip(got, want)):
          self.assertAllClose(g, w_, rtol=1e-5, atol=1e-6, msg=str(k))


class UpdateTest(tf.test.TestCase):

  def testApplySubtractsTheProductInPlace(self):
    isa = _kernels_or_skip(self)
    rng = np.random.RandomState(1)
    w0 = rng.uniform(-1, 1, (6, 9)).astype(np.float32)
    x = rng.uniform(-1, 1, (4, 6)).astype(np.float32)
    g = rng.uniform(-1, 1, (4, 9)).astype(np.float32)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      var = tf.Variable(w0)
      update = low_rank_update.apply(var, LowRankGradient(x, g),
                                     tf.constant(0.25), isa)
      sess.run(var.initializer)
      sess.run(update)
      self.assertAllClose(sess.run(var), w0 - 0.25 * (x.T @ g), rtol=1e-6)

  def _train(self, rnn_mode, updates, devices=("/cpu:0",), clip=0.85,
             steps=6):
    """Costs, weights, the ops' types, the norms and the first weights.

    A tiny model whose plan updates its weights as `updates` says (DENSE
    or FACTORS), on `devices`, clipped to the norm `clip`.
    """
    config = testing.TinyConfig()
    config.num_steps, config.max_grad_norm = 3, clip
    config.rnn_mode = rnn_mode
    rows = np.random.RandomState(5).randint(
        0, config.vocab_size,
        (config.batch_size * len(devices), steps * 3 + 1))
    plan = dataclasses.replace(
        training_plan(config, 4, devices=devices), updates=updates,
        isa=plan_lib.offered().isa if updates == plan_lib.FACTORS else None)
    with tf.Graph().as_default() as graph:
      model = build_tiny_model(config, rows, rnn_mode, devices, seed=2,
                               plan=plan)
      types = {op.type for op in graph.get_operations()}
      params = tf.compat.v1.trainable_variables()
      norm = tf.linalg.global_norm(tf.compat.v1.gradients(model.cost, params))
      with tf.compat.v1.Session(
          config=devices_lib.session_config(devices, 0, 0)) as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  tf.compat.v1.local_variables_initializer()])
        model.assign_lr(sess, 1.0)
        first = sess.run(params)
        runs = [sess.run([model.cost, norm, model.train_op,
                          model.update_state]) for _ in range(steps)]
        weights = sess.run(params)
    return [r[0] for r in runs], weights, types, [r[1] for r in runs], first

  def _assert_same_training(self, factored, dense, clip=0.85):
    # Steps with and without clipping both occur.
    self.assertGreater(max(dense[3]), clip)
    self.assertLess(min(dense[3]), clip)
    self.assertNotIn("ApplyOuterProduct", dense[2])
    self.assertIn("ApplyOuterProduct", factored[2])
    self.assertAllClose(factored[0], dense[0], rtol=1e-5)
    for got, want, first in zip(factored[1], dense[1], dense[4]):
      self.assertAllClose(got, want, rtol=1e-5, atol=1e-6)
      # The weights moved: the comparison is not of initial values.
      self.assertNotAllClose(want, first, rtol=0, atol=1e-5)

  def testFactorsGiveTheDenseClippedUpdateOverSteps(self):
    _kernels_or_skip(self)
    for mode in (BASIC, BLOCK):
      with self.subTest(mode=mode):
        self._assert_same_training(self._train(mode, plan_lib.FACTORS),
                                   self._train(mode, plan_lib.DENSE))

  def testTowersAverageTheirFactors(self):
    # The plan keeps two towers dense; a plan forced to factors gives the
    # same training, the towers' rows concatenated (util._average).
    _kernels_or_skip(self)
    towers = ("/cpu:0", "/cpu:1")
    self._assert_same_training(
        self._train(BASIC, plan_lib.FACTORS, towers, clip=0.55),
        self._train(BASIC, plan_lib.DENSE, towers, clip=0.55), clip=0.55)


if __name__ == "__main__":
  tf.test.main()
