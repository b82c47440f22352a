"""Tests of util.py: towers, gradient averaging and the cuDNN weight layout."""

import copy
import os
import re
import tempfile
import unittest

import numpy as np
import tensorflow as tf

from ptb import devices as devices_lib
from ptb import lstm
from ptb import lstm_test
from ptb import plan as plan_lib
from ptb import testing
import ptb_word_lm
from ptb_word_lm_testing import build_tiny_model
import util

HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
NO_GPU_REASON = ("needs a GPU: CudnnRNNV3 and CudnnRNNCanonicalToParams have "
                 "no CPU kernels (owed on real GPU hardware)")


def _train_one_step(config, rows, rnn_mode, devices, weights=None):
  """Builds a model, optionally loads `weights`, runs one SGD step.

  Returns:
    (cost before the step, trainable values before, trainable values after).
  """
  with tf.Graph().as_default():
    model = build_tiny_model(config, rows, rnn_mode, devices=devices)
    tvars = tf.compat.v1.trainable_variables()
    session_config = tf.compat.v1.ConfigProto(
        device_count={"CPU": len(devices)}, allow_soft_placement=False)
    with tf.compat.v1.Session(config=session_config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(tf.compat.v1.local_variables_initializer())
      if weights is not None:
        for var, value in zip(tvars, weights):
          var.load(value, sess)
      model.assign_lr(sess, 1.0)
      before = sess.run(tvars)
      cost, _ = sess.run([model.cost, model.train_op])
      return cost, before, sess.run(tvars)


def _train_steps(config, data, rnn_mode, devices, weights, lr=1.0,
                 reset_every_step=False):
  """Trains one pass over `data` with `ptb_word_lm.run_epoch`, state carried.

  Builds the model the way training does (`ptb_word_lm.build_model`), loads
  `weights` into its trainable variables (in their creation order) and runs
  one training pass: every step runs the cost, the update and the state
  update, and the next step starts from the state this one stored (from
  zeros with `reset_every_step`: a reference that carries no state).

  Returns:
    (per-step costs, trainable values after, each tower's state variable
    after: `[layers, 2, batch, hidden]`).
  """
  config = copy.copy(config)
  config.rnn_mode = rnn_mode
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    model = ptb_word_lm.build_model("Train", True, config, data, devices)
    tvars = tf.compat.v1.trainable_variables()
    costs = []
    with tf.compat.v1.Session(
        config=devices_lib.session_config(devices, 0, 0)) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(tf.compat.v1.local_variables_initializer())
      for var, value in zip(tvars, weights):
        var.load(value, sess)
      model.assign_lr(sess, lr)

      def on_step(step, cost, total):
        del step, total  # Unused.
        costs.append(cost)
        if reset_every_step:
          sess.run(model.reset_state)

      ptb_word_lm.run_epoch(sess, model, eval_op=model.train_op,
                            on_step=on_step)
      return costs, sess.run(tvars), sess.run(model.state_variables)


class TowerTest(tf.test.TestCase):

  def testTowerDevices(self):
    self.assertEqual(util.tower_devices(2), ["/gpu:0", "/gpu:1"])
    self.assertEqual(util.tower_devices(0), ["/cpu:0"])
    self.assertEqual(util.tower_devices(0, 3), ["/cpu:0", "/cpu:1", "/cpu:2"])
    self.assertEqual(util.variable_device(["/gpu:0"]), "/gpu:0")
    self.assertEqual(util.variable_device(["/gpu:0", "/gpu:1"]), "/cpu:0")

  def testSplitRowsGivesEachTowerItsBlock(self):
    rows = util.split_rows(tf.reshape(tf.range(12), [6, 2]), 3)
    self.assertAllEqual([self.evaluate(r)[:, 0] for r in rows],
                        [[0, 2], [4, 6], [8, 10]])
    self.assertEqual(util.split_rows(None, 3), [None, None, None])

  def testAverageGradientsDenseAndSparse(self):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      dense = [tf.constant([1.0, 2.0]), tf.constant([3.0, 6.0])]
      sparse = [tf.IndexedSlices(tf.constant([[1.0, 1.0]]), tf.constant([0]),
                                 tf.constant([3, 2])),
                tf.IndexedSlices(tf.constant([[4.0, 2.0]]), tf.constant([2]),
                                 tf.constant([3, 2]))]
      avg_dense, avg_sparse = util.average_gradients(zip(dense, sparse))
      self.assertAllClose(sess.run(avg_dense), [2.0, 4.0])
      self.assertAllClose(sess.run(tf.convert_to_tensor(avg_sparse)),
                          [[0.5, 0.5], [0, 0], [2.0, 1.0]])

  def testTwoTowersEqualOneTowerWithDoubleBatch(self):
    # Tower k trains on rows [k*B, (k+1)*B) of the 2B rows the producer
    # delivers; one tower of batch 2B sees the same rows. The cost and the
    # variables after one SGD step must agree.
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      config = testing.TinyConfig()
      rows = np.random.RandomState(7).randint(
          0, config.vocab_size,
          size=(2 * config.batch_size, config.num_steps + 1)).astype(np.int32)
      big = testing.TinyConfig()
      big.batch_size = 2 * config.batch_size
      cost1, weights, after1 = _train_one_step(big, rows, mode, ["/cpu:0"])
      cost2, before2, after2 = _train_one_step(
          config, rows, mode, ["/cpu:0", "/cpu:1"], weights=weights)
      for w, b in zip(weights, before2):
        self.assertAllEqual(w, b)
      self.assertAllClose(cost1, cost2, rtol=1e-5, msg=mode)
      for a1, a2, w in zip(after1, after2, weights):
        self.assertAllClose(a1, a2, rtol=1e-5, atol=1e-7, msg=mode)
        self.assertGreater(np.abs(a1 - w).max(), 0)  # The step changed it.

  def testTwoTowersEqualOneTowerWithDoubleBatchOverSteps(self):
    # The one-step test above starts from zero state, where any assignment
    # of rows to towers gives the same cost. Here a training pass of
    # num_steps windows carries each tower's state from step to step, so a
    # tower that read another's state (shared or swapped) or lost its own
    # (reset every step) would train on other numbers than the single tower
    # of batch 2B, whose rows [k*B, (k+1)*B) are tower k's.
    num_steps = 5
    config = testing.TinyConfig()
    config.vocab_size = 20
    big = copy.copy(config)
    big.batch_size = 2 * config.batch_size
    rng = np.random.RandomState(11)
    # Random ids: every row, so every tower, is a different stream.
    data = rng.randint(0, config.vocab_size, size=2 * config.batch_size * (
        num_steps * config.num_steps + 1)).astype(np.int32)
    size, vocab = config.hidden_size, config.vocab_size
    shapes = ([[vocab, size]] + [[2 * size, 4 * size], [4 * size]] *
              config.num_layers + [[size, vocab], [vocab]])
    weights = [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in shapes]
    batch = config.batch_size
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      costs1, after1, (state1,) = _train_steps(big, data, mode, ["/cpu:0"],
                                               weights)
      costs2, after2, states2 = _train_steps(config, data, mode,
                                             ["/cpu:0", "/cpu:1"], weights)
      self.assertLen(costs1, num_steps, msg=mode)
      self.assertAllClose(costs1, costs2, rtol=1e-5, atol=0, msg=mode)
      for a1, a2, w in zip(after1, after2, weights):
        self.assertAllClose(a1, a2, rtol=1e-5, atol=1e-5, msg=mode)
        self.assertGreater(np.abs(a1 - w).max(), 1e-2)  # Training moved it.
      self.assertLen(states2, 2)
      for k, state in enumerate(states2):
        self.assertAllClose(state, state1[:, :, k * batch:(k + 1) * batch],
                            rtol=1e-5, atol=1e-5, msg=mode)
      # The towers' states differ enough for a swap to show.
      self.assertGreater(np.abs(states2[0] - states2[1]).max(), 0.1)
      # And the state is carried: from zeros at every step, the costs of
      # steps 2.. differ (the first step starts from zeros either way).
      costs0, _, _ = _train_steps(big, data, mode, ["/cpu:0"], weights,
                                  reset_every_step=True)
      self.assertAllClose(costs0[0], costs1[0], rtol=1e-5, atol=0)
      self.assertGreater(
          np.min(np.abs(np.subtract(costs0, costs1))[1:] / costs1[1:]), 1e-4)

  def testTowersPlaceWorkOnTheirDevices(self):
    config = testing.TinyConfig()
    rows = np.zeros([2 * config.batch_size, config.num_steps + 1], np.int32)
    with tf.Graph().as_default():
      build_tiny_model(config, rows, ptb_word_lm.BLOCK,
                       devices=["/cpu:0", "/cpu:1"])
      ops = tf.compat.v1.get_default_graph().get_operations()
      # BLOCK's cell on the CPU: the kernels' LstmCell, or BlockLSTM where
      # they are not there (one op per layer).
      fused = plan_lib.offered().isa is not None
      cells = [op for op in ops
               if op.type == ("LstmCell" if fused else "BlockLSTM")]
      per_tower = config.num_layers * (config.num_steps if fused else 1)
      self.assertEqual(sorted(op.device[-5:] for op in cells),
                       ["CPU:0"] * per_tower + ["CPU:1"] * per_tower)
      state_vars = [v for v in tf.compat.v1.local_variables()
                    if "lstm_state" in v.name]
      self.assertLen(state_vars, 2)  # Each tower carries its own state.

  def testCpuTowersTrainLikeOneTowerWithDoubleBatch(self):
    with tempfile.TemporaryDirectory() as tmp:
      # Learnable only with each tower's state carried: a tower that loses
      # its state, or takes another's, ends above LEARNED_TEST_PERPLEXITY.
      # Twice the lines of the corpus's default: batch 40 takes half the steps.
      testing.make_structured_corpus(tmp, train_lines=3000)
      base = ["--data_path=" + tmp, "--model=test", "--num_gpus=0", "--seed=1",
              "--config_overrides=" + testing.LEARNING_OVERRIDES]
      code, towers, err = testing.run_script(*(base + ["--cpu_towers=2"]))
      self.assertEqual(code, 0, err)
      base[-1] += ",batch_size=40"
      code, single, err = testing.run_script(*base)
      self.assertEqual(code, 0, err)

    def figures(out, what):
      return [float(v) for v in re.findall(what + r" Perplexity: (\S+)", out)]

    self.assertLess(figures(towers, "Test")[0], testing.LEARNED_TEST_PERPLEXITY)
    for what in ("Train", "Test"):
      got, want = figures(towers, what), figures(single, what)
      self.assertNotEmpty(want)
      self.assertAllClose(got, want, rtol=0.01, msg=what)


class ClippedGradientDescentTest(tf.test.TestCase):

  def _step(self, dense_grad, sparse_values, max_norm, lr=0.5):
    """One update of a dense [2, 2] and a sparse-updated [3, 2] variable."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      dense = tf.compat.v1.Variable(np.ones([2, 2], np.float32))
      table = tf.compat.v1.Variable(np.ones([3, 2], np.float32))
      sparse = tf.IndexedSlices(tf.constant(sparse_values, tf.float32),
                                tf.constant([2, 0]), tf.constant([3, 2]))
      op = util.ClippedGradientDescent(lr, max_norm).apply_gradients(
          [(tf.constant(dense_grad, tf.float32), dense), (sparse, table)])
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(op)
      return sess.run([dense, table])

  def testUpdateIsThatOfTheClippedGradients(self):
    dense_grad = np.array([[3.0, 0.0], [0.0, 0.0]], np.float32)
    sparse_values = np.array([[0.0, 4.0], [0.0, 0.0]], np.float32)
    # Global norm 5: with max_norm 2.5 every gradient is halved.
    for max_norm, factor in ((10.0, 1.0), (2.5, 0.5)):
      dense, table = self._step(dense_grad, sparse_values, max_norm)
      self.assertAllClose(dense, 1.0 - 0.5 * factor * dense_grad)
      want = np.ones([3, 2], np.float32)
      want[2, 1] -= 0.5 * factor * 4.0
      self.assertAllClose(table, want)

  def testNonFiniteNormGivesNanWeightsLikeClipByGlobalNorm(self):
    dense, table = self._step([[np.inf, 0.0], [0.0, 0.0]],
                              [[0.0, 1.0], [0.0, 0.0]], 5.0)
    self.assertTrue(np.isnan(dense).all())
    self.assertTrue(np.isnan(table[[0, 2]]).all())
    self.assertAllEqual(table[1], [1.0, 1.0])


class CudnnLayoutTest(tf.test.TestCase):

  def _weights(self, input_size=3, hidden=4, seed=2):
    rng = np.random.RandomState(seed)
    return (rng.uniform(-1, 1, [input_size + hidden, 4 * hidden]),
            rng.uniform(-1, 1, [4 * hidden]))

  def testRoundTripIsExact(self):
    kernel, bias = self._weights()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      weights, biases = util.canonical_to_cudnn(
          tf.constant(kernel), tf.constant(bias), 3)
      back = sess.run(util.cudnn_to_canonical(weights, biases))
      weights, biases = sess.run([weights, biases])
    self.assertAllEqual(back[0], kernel)
    self.assertAllEqual(back[1], bias)
    self.assertEqual([w.shape for w in weights], [(4, 3)] * 4 + [(4, 4)] * 4)
    self.assertEqual([b.shape for b in biases], [(4,)] * 8)
    self.assertAllEqual(np.concatenate(biases[4:]), np.zeros(16))

  def testCudnnGateOrderStepEqualsBasicStep(self):
    """An LSTM step written the way cuDNN defines it equals the BASIC cell."""
    kernel, bias = self._weights()
    rng = np.random.RandomState(3)
    x, c, h = (rng.uniform(-1, 1, s) for s in ([2, 3], [2, 4], [2, 4]))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      weights, biases = sess.run(util.canonical_to_cudnn(
          tf.constant(kernel), tf.constant(bias), 3))
      outputs, state = lstm.lstm_layer(
          plan_lib.lstm(ptb_word_lm.BASIC, 1, 4, 2, 1),
          tf.constant(x[None]),
          util.LSTMStateTuple(tf.constant(c), tf.constant(h)),
          tf.constant(kernel), tf.constant(bias))
      want_h, want_c = sess.run([outputs[0], state.c])
    sigmoid = lambda v: 1 / (1 + np.exp(-v))
    # cuDNN: gate g = W_g x + R_g h + bW_g + bR_g, g in (i, f, c, o).
    gate = [x @ weights[g].T + h @ weights[4 + g].T + biases[g] + biases[4 + g]
            for g in range(4)]
    i, f, cand, o = (sigmoid(gate[0]), sigmoid(gate[1]), np.tanh(gate[2]),
                     sigmoid(gate[3]))
    got_c = f * c + i * cand
    got_h = o * np.tanh(got_c)
    self.assertAllClose(got_c, want_c, rtol=1e-12)
    self.assertAllClose(got_h, want_h, rtol=1e-12)


@unittest.skipUnless(HAS_GPU, NO_GPU_REASON)
class CudnnGpuTest(tf.test.TestCase):

  def testCudnnEqualsBasicValuesAndGradients(self):
    inputs = lstm_test.random_layer_inputs(num_steps=5, batch=3, input_size=4,
                                           hidden=6)
    results = {}
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.CUDNN):
      with tf.Graph().as_default(), tf.device("/gpu:0"):
        fetches = lstm_test.layer_outputs(mode, inputs)
        with tf.compat.v1.Session() as sess:
          results[mode] = sess.run(fetches)
    for basic, cudnn in zip(results[ptb_word_lm.BASIC],
                            results[ptb_word_lm.CUDNN]):
      self.assertAllClose(basic, cudnn, rtol=1e-4, atol=1e-5)

  def testCudnnModelCostAndGradientsEqualBasic(self):
    config = testing.TinyConfig()
    rows = np.random.RandomState(3).randint(
        0, config.vocab_size, size=(config.batch_size, config.num_steps + 1))
    results = {}
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.CUDNN):
      with tf.Graph().as_default():
        model = build_tiny_model(config, rows, mode, devices=["/gpu:0"])
        tvars = tf.compat.v1.trainable_variables()
        grads = [tf.convert_to_tensor(g)
                 for g in tf.compat.v1.gradients(model.cost, tvars)]
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          sess.run(tf.compat.v1.local_variables_initializer())
          results[mode] = sess.run([model.cost] + grads)
    for a, b in zip(results[ptb_word_lm.BASIC], results[ptb_word_lm.CUDNN]):
      self.assertAllClose(a, b, rtol=1e-4, atol=1e-6)


if __name__ == "__main__":
  tf.test.main()
