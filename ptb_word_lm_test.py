"""Tests of the model, the training step and the command line of ptb_word_lm.py."""

import contextlib
import copy
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl import logging
import numpy as np
import tensorflow as tf

from ptb import config as config_lib
from ptb import devices as devices_lib
from ptb import lstm
from ptb import monitor
from ptb import plan as plan_lib
from ptb import training
from ptb.errors import UserError
from ptb.params import create_params
from ptb.testing import HERE
from ptb.testing import LEARNED_TEST_PERPLEXITY
from ptb.testing import SCRIPT
from ptb.testing import TinyConfig
from ptb.testing import learning_args
from ptb.testing import make_corpus
from ptb.testing import make_structured_corpus
from ptb.testing import reference_lstm
from ptb.testing import unigram_perplexity
from ptb.watch import Watch
import ptb_word_lm
from ptb_word_lm_testing import InProcessRunTest
from ptb_word_lm_testing import build_tiny_model
from ptb_word_lm_testing import learning_config
from ptb_word_lm_testing import run_in_process
from ptb_word_lm_testing import training_plan
import reader
import reader_test

PTB_PATH = reader_test.PTB_PATH


class ModelTest(tf.test.TestCase):

  def _rows(self, batch, steps, seed=3):
    return np.random.RandomState(seed).randint(
        0, TinyConfig.vocab_size, size=(batch, steps + 1)).astype(np.int32)

  def testBasicEqualsBlockModelCostAndGradients(self):
    config = TinyConfig()
    rows = self._rows(config.batch_size, config.num_steps)
    results = {}
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      with tf.Graph().as_default():
        model = build_tiny_model(config, rows, mode)
        tvars = tf.compat.v1.trainable_variables()
        grads = [tf.convert_to_tensor(g) for g in
                 tf.compat.v1.gradients(model.cost, tvars)]
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          sess.run(tf.compat.v1.local_variables_initializer())
          results[mode] = sess.run([model.cost] + grads)
    for i, (a, b) in enumerate(zip(results[ptb_word_lm.BASIC],
                                   results[ptb_word_lm.BLOCK])):
      self.assertAllClose(a, b, rtol=1e-5, atol=1e-7, msg="fetch %d" % i)

  def testCostIsSumOverTimeOfBatchMeanCrossEntropy(self):
    config = TinyConfig()
    rows = self._rows(config.batch_size, config.num_steps)
    with tf.Graph().as_default():
      model = build_tiny_model(config, rows, ptb_word_lm.BLOCK)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(tf.compat.v1.local_variables_initializer())
        weights = sess.run(tf.compat.v1.trainable_variables())
        cost = sess.run(model.cost)
    emb, k0, b0, k1, b1, sw, sb = weights
    x, y = rows[:, :-1], rows[:, 1:]
    zeros = np.zeros([config.batch_size, config.hidden_size])
    h, _, _ = reference_lstm(emb[x.T], zeros, zeros, k0, b0)
    h, _, _ = reference_lstm(h, zeros, zeros, k1, b1)
    logits = h @ sw + sb                         # [T, B, V]
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    xent = -np.take_along_axis(logp, y.T[..., None], -1)[..., 0]
    self.assertAllClose(cost, xent.mean(1).sum(), rtol=1e-5)

  def testOneSgdStepLowersCost(self):
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      config = TinyConfig()
      rows = self._rows(config.batch_size, config.num_steps)
      with tf.Graph().as_default():
        model = build_tiny_model(config, rows, mode)
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          sess.run(tf.compat.v1.local_variables_initializer())
          model.assign_lr(sess, 1.0)
          # epoch_size is 1: every call sees the same batch from zero state.
          before, _ = sess.run([model.cost, model.train_op])
          after = sess.run(model.cost)
      self.assertLess(after, before - 1e-3, msg=mode)

  def testStateIsCarriedAndReset(self):
    config = TinyConfig()
    rows = np.random.RandomState(5).randint(
        0, config.vocab_size, size=config.batch_size * 3 * config.num_steps + 4)
    with tf.Graph().as_default():
      model = build_tiny_model(config, rows, ptb_word_lm.BLOCK,
                               is_training=False)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(tf.compat.v1.local_variables_initializer())
        init0 = sess.run(model.initial_state)
        _, final0 = sess.run([model.update_state, model.final_state])
        init1 = sess.run(model.initial_state)
        sess.run(model.reset_state)
        init2 = sess.run(model.initial_state)
    self.assertAllEqual(np.asarray(init0), np.zeros_like(np.asarray(init0)))
    self.assertAllClose(np.asarray(init1), np.asarray(final0))
    self.assertGreater(np.abs(np.asarray(init1)).sum(), 0)
    self.assertAllEqual(np.asarray(init2), np.zeros_like(np.asarray(init2)))

  def testInitialValuesAreTheOriginals(self):
    """BASIC, BLOCK: LSTM biases zero, the rest uniform in ±init_scale.

    CUDNN's biases are uniform too (the original's opaque buffer), and so
    are the input biases of the cuDNN weights converted from them; the
    recurrent biases that the conversion adds are zero.
    """
    config = TinyConfig()
    config.hidden_size, config.vocab_size = 64, 100
    scale = config.init_scale
    rows = self._rows(config.batch_size, config.num_steps)
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK, ptb_word_lm.CUDNN):
      with tf.Graph().as_default():
        if mode == ptb_word_lm.CUDNN:
          # Its variables alone: a graph with cuDNN's ops needs a GPU.
          config.rnn_mode = mode
          with tf.compat.v1.variable_scope(
              "Model", initializer=tf.compat.v1.random_uniform_initializer(
                  -scale, scale)):
            create_params(config, tf.float32)
        else:
          build_tiny_model(config, rows, mode, is_training=False)
        tvars = tf.compat.v1.trainable_variables()
        by_name = dict(zip([v.op.name for v in tvars], tvars))
        _, cudnn_biases = lstm.canonical_to_cudnn(
            by_name["Model/RNN/cell_0/kernel"],
            by_name["Model/RNN/cell_0/bias"], config.hidden_size)
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          values, cudnn_biases = sess.run([by_name, cudnn_biases])
      self.assertCountEqual(values, [
          "Model/embedding", "Model/RNN/cell_0/kernel", "Model/RNN/cell_0/bias",
          "Model/RNN/cell_1/kernel", "Model/RNN/cell_1/bias",
          "Model/softmax_w", "Model/softmax_b"])
      zero_biases = mode != ptb_word_lm.CUDNN
      for name, value in values.items():
        if zero_biases and name.endswith("/bias"):
          self.assertAllEqual(value, np.zeros_like(value), msg=name)
        else:
          self.assertUniform(value, scale, "%s %s" % (mode, name))
      for k, value in enumerate(cudnn_biases):
        if k < 4 and not zero_biases:
          self.assertUniform(value, scale, "%s cuDNN bias %d" % (mode, k))
        else:
          self.assertAllEqual(value, np.zeros_like(value))

  def assertUniform(self, value, scale, msg):
    """`value` looks drawn uniform in ±scale: within it, spread across it."""
    self.assertLessEqual(np.abs(value).max(), scale, msg=msg)
    # |U(-s, s)| has mean s / 2; a zero or constant start is far from it.
    self.assertAllClose(np.abs(value).mean(), scale / 2, rtol=0.25, msg=msg)
    self.assertLess(value.min(), -scale / 2, msg=msg)
    self.assertGreater(value.max(), scale / 2, msg=msg)

  def testTrainFromZeroStateZeroesOnlyTrainingsState(self):
    """--train_from_zero_state: every training step starts from zeros;
    validation and test still carry the state from call to call."""
    config = learning_config()
    with tempfile.TemporaryDirectory() as tmp:
      *data, config.vocab_size = reader.ptb_raw_data(make_corpus(tmp))
    eval_config = copy.copy(config)
    eval_config.batch_size = eval_config.num_steps = 1
    for zero in (False, True):
      with tf.Graph().as_default():
        m, mvalid, mtest = ptb_word_lm.build_models(
            config, eval_config, data, ("/cpu:0",), False, 20,
            train_from_zero_state=zero)
        with tf.compat.v1.Session() as sess:
          sess.run([tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer()])
          m.assign_lr(sess, 1.0)
          for model, fetches in ((m, [m.train_op]), (mvalid, []),
                                 (mtest, [])):
            sess.run(model.reset_state)
            _, final = sess.run([model.update_state, model.final_state] +
                                fetches)[:2]
            after = np.asarray(sess.run(model.initial_state))
            self.assertGreater(np.abs(np.asarray(final)).sum(), 0)
            if zero and model is m:
              self.assertAllEqual(after, np.zeros_like(after))
            else:
              self.assertAllEqual(after, np.asarray(final))


def train_in_process(config, data, eval_unroll=20, seed=1):
  """Trains `config` as main does, in this process.

  Returns:
    (graph, session, (m, mvalid, mtest)) with the trained weights; the
    caller closes the session.
  """
  eval_config = copy.copy(config)
  eval_config.batch_size = eval_config.num_steps = 1
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(seed)
    models = ptb_word_lm.build_models(config, eval_config, data,
                                      ("/cpu:0",), False, eval_unroll)
    session = tf.compat.v1.Session(graph=graph)
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
    train = models[0]
    for i in range(config.max_max_epoch):
      train.assign_lr(session, config_lib.epoch_learning_rate(config, i))
      ptb_word_lm.run_epoch(session, train, eval_op=train.train_op)
  return graph, session, models


class StructuredCorpusTest(tf.test.TestCase):

  def testOnlyAModelThatCarriesItsStateLearnsIt(self):
    with tempfile.TemporaryDirectory() as tmp:
      train, valid, test, _ = reader.ptb_raw_data(
          make_structured_corpus(tmp))
    unigram = unigram_perplexity(train, test)
    # Validation and test one word a call, so that a reset after every call
    # leaves the model only the current word.
    graph, session, models = train_in_process(learning_config(),
                                              (train, valid, test),
                                              eval_unroll=1)
    with graph.as_default(), session:
      _, _, model = models
      carried = ptb_word_lm.run_epoch(session, model)
      lost = ptb_word_lm.run_epoch(
          session, model, on_step=lambda *_: session.run(model.reset_state))
    # Measured: unigram 11.0, state carried 2.2-2.3, state lost 170-224:
    # without it the model predicts confidently from the wrong words.
    self.assertGreater(unigram, 9.0)
    self.assertGreater(lost, 9.0)
    self.assertLess(carried, LEARNED_TEST_PERPLEXITY)


def reference_cost(weights, rows, masks=None):
  """The model's cost in numpy from zero state, dropout masks applied.

  The network as docs/model.md describes it: reference_lstm's cell, the
  masks on the inputs and on every layer's output, the softmax, and the
  batch-averaged cross-entropy summed over the steps.

  Args:
    weights: the trainable variables' values (embedding, a kernel and a
      bias per layer, softmax_w, softmax_b).
    rows: `[batch, steps + 1]` ids.
    masks: None or PTBModel.dropout_masks' values.
  """
  emb, layers, sw, sb = weights[0], weights[1:-2], weights[-2], weights[-1]
  x, y = rows[:, :-1], rows[:, 1:]
  h = emb[x.T]                                              # [T, B, H]
  masks = masks or {"layers": [1.0] * len(layers)}
  h = h * masks.get("input", 1.0)
  for l in range(len(layers) // 2):
    zeros = np.zeros([rows.shape[0], emb.shape[1]])
    h, _, _ = reference_lstm(h, zeros, zeros, layers[2 * l],
                             layers[2 * l + 1])
    if l < len(layers) // 2 - 1:
      h = h * masks["layers"][l]
  h = h * masks.get("output", 1.0)
  logits = h @ sw + sb                                      # [T, B, V]
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  xent = -np.take_along_axis(logp, y.T[..., None], -1)[..., 0]
  return xent.mean(1).sum()


class DropoutTest(tf.test.TestCase):
  """Dropout in PTBModel: where the masks go, their rate, their scale."""

  def _config(self, keep_prob):
    config = TinyConfig()
    config.keep_prob = keep_prob
    config.hidden_size, config.num_steps, config.batch_size = 40, 10, 10
    config.init_scale = 1.0  # logits far enough from 0 for dropout to show
    return config

  def _rows(self, config, seed=3):
    return np.random.RandomState(seed).randint(
        0, config.vocab_size,
        size=(config.batch_size, config.num_steps + 1)).astype(np.int32)

  def testMasksHaveTheRateAndScaleAndAreAppliedWhereTheSpecSays(self):
    # BASIC as a wavefront of chunks (hidden sizes below 1024), BASIC layer
    # by layer (as from 1024 on: large), and BLOCK.
    for mode, chunk in ((ptb_word_lm.BASIC, 4), (ptb_word_lm.BASIC, None),
                        (ptb_word_lm.BLOCK, 4)):
      config = self._config(0.5)
      rows = self._rows(config)
      config.rnn_mode = mode
      with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        model = build_tiny_model(config, rows, mode,
                                 plan=training_plan(config, chunk))
        masks = model.dropout_masks
        self.assertCountEqual(masks, ["input", "layers", "output"])
        self.assertLen(masks["layers"], config.num_layers - 1)
        with tf.compat.v1.Session() as sess:
          sess.run([tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer()])
          weights = sess.run(tf.compat.v1.trainable_variables())
          cost, drawn = sess.run([model.cost, masks])
          again = sess.run(masks)
      all_masks = [drawn["input"], drawn["output"]] + drawn["layers"]
      for m in all_masks:
        self.assertEqual(m.shape, (config.num_steps, config.batch_size,
                                   config.hidden_size))
        self.assertEqual(set(np.unique(m)), {0.0, 2.0})   # 1 / keep_prob
        # 4,000 draws: the fraction dropped is 0.5 +- 0.008 (one sigma).
        self.assertBetween(np.mean(m == 0), 0.46, 0.54)
        # A mask of its own at every time step...
        self.assertFalse(np.array_equal(m[0], m[1]))
      # ... for every place it is applied, and at every session call.
      for a in range(len(all_masks)):
        for b in range(a):
          self.assertFalse(np.array_equal(all_masks[a], all_masks[b]))
      self.assertFalse(np.array_equal(drawn["input"], again["input"]))
      # The cost is that of the model of docs/model.md with these masks.
      self.assertAllClose(cost, reference_cost(weights, rows, drawn),
                          rtol=1e-5, msg=mode)
      self.assertNotAllClose(cost, reference_cost(weights, rows), rtol=1e-3)

  def testMasksFollowFromTheSavedKeyAndCountAndDifferByTower(self):
    # What a checkpoint carries (the key and the count of calls) fixes the
    # masks, so a resumed run draws what the uninterrupted one would have.
    config = self._config(0.5)
    config.batch_size = 4  # rows per tower
    rows = np.concatenate([self._rows(config, 3), self._rows(config, 4)])
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(7)
      model = build_tiny_model(config, rows, ptb_word_lm.BASIC,
                               devices=("/cpu:0", "/cpu:0"))
      seed_vars = {v.op.name: v for v in tf.compat.v1.global_variables()
                   if v.op.name.startswith("dropout/")}
      self.assertCountEqual(seed_vars, ["dropout/key", "dropout/draws"])
      states = model._states  # pylint: disable=protected-access
      towers = [s.masks for s in states]
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        first, second = sess.run(towers), sess.run(towers)
        self.assertEqual(sess.run(seed_vars["dropout/draws"]), 2)
        seed_vars["dropout/draws"].load(1, sess)
        again = sess.run(towers)
        seed_vars["dropout/key"].load(sess.run(seed_vars["dropout/key"]) + 1,
                                      sess)
        seed_vars["dropout/draws"].load(1, sess)
        other_key = sess.run(towers)
    for tower in range(2):
      for place in ("input", "output"):
        self.assertAllEqual(again[tower][place], second[tower][place])
        self.assertFalse(np.array_equal(first[tower][place],
                                        second[tower][place]))
        self.assertFalse(np.array_equal(other_key[tower][place],
                                        second[tower][place]))
    self.assertFalse(np.array_equal(first[0]["input"], first[1]["input"]))

  def testNoDropoutInValidationAndTest(self):
    config = self._config(0.5)
    rows = self._rows(config)
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(7)
      train = build_tiny_model(config, rows, ptb_word_lm.BASIC)
      evaluate = build_tiny_model(config, rows, ptb_word_lm.BASIC,
                                  is_training=False)
      plain = build_tiny_model(self._config(1.0), rows, ptb_word_lm.BASIC,
                               is_training=False)
      self.assertEqual(evaluate.dropout_masks, {})
      self.assertEqual(plain.dropout_masks, {})
      with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  tf.compat.v1.local_variables_initializer()])
        weights = sess.run(tf.compat.v1.trainable_variables())
        costs = [sess.run(m.cost) for m in (evaluate, evaluate, plain)]
        train_cost = sess.run(train.cost)
    self.assertEqual(costs[0], costs[1])
    self.assertEqual(costs[0], costs[2])
    self.assertAllClose(costs[0], reference_cost(weights, rows), rtol=1e-5)
    self.assertNotAllClose(train_cost, costs[0], rtol=1e-3)


# The formats of the output's lines: the original's (README), and the
# Peak RSS line that this port adds.
LINE_FORMATS = [
    r"Epoch: \d+ Learning rate: \d+\.\d{3}",
    r"\d+\.\d{3} perplexity: \d+\.\d{3} speed: \d+ wps",
    r"Epoch: \d+ Train Perplexity: \d+\.\d{3}",
    r"Epoch: \d+ Valid Perplexity: \d+\.\d{3}",
    r"Test Perplexity: \d+\.\d{3}",
    r"Peak RSS: \d+ MiB",
    r"Saving model to .+\.",
]


def _tutorial_training(weights, rows, config, num_calls):
  """The tutorial's training steps, written afresh from docs/model.md.

  Plain TensorFlow ops and their automatic gradients, the state fed between
  steps, and the tutorial's update: tf.clip_by_global_norm of tf.gradients
  (the embedding's gradient as IndexedSlices), then plain SGD. Independent
  of PTBModel's hand-written gradients, kernels, state variables and
  optimizer. No dropout.

  Args:
    weights: the initial [embedding, kernel, bias, ..., softmax_w, softmax_b].
    rows: int `[batch, num_calls * num_steps + 1]` contiguous streams.

  Returns:
    (the cost of each step, the global norm of each step's gradients, the
    weights after the last).
  """
  steps, batch, size = config.num_steps, config.batch_size, config.hidden_size
  with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    params = [tf.Variable(w) for w in weights]
    x = tf.compat.v1.placeholder(tf.int32, [batch, steps])
    y = tf.compat.v1.placeholder(tf.int32, [batch, steps])
    state_in = tf.compat.v1.placeholder(
        tf.float32, [config.num_layers, 2, batch, size])
    inputs = tf.nn.embedding_lookup(params[0], x)
    finals = []
    for l in range(config.num_layers):
      kernel, bias = params[1 + 2 * l], params[2 + 2 * l]
      c, h, outputs = state_in[l, 0], state_in[l, 1], []
      for t in range(steps):
        gates = tf.matmul(tf.concat([inputs[:, t], h], 1), kernel) + bias
        i, j, f, o = tf.split(gates, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(j)
        h = tf.sigmoid(o) * tf.tanh(c)
        outputs.append(h)
      inputs = tf.stack(outputs, 1)
      finals.append(tf.stack([c, h]))
    logits = tf.matmul(tf.reshape(inputs, [-1, size]), params[-2]) + params[-1]
    cost = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.reshape(y, [-1]), logits=logits)) / batch
    grads, norm = tf.clip_by_global_norm(tf.compat.v1.gradients(cost, params),
                                         config.max_grad_norm)
    train = tf.compat.v1.train.GradientDescentOptimizer(
        config.learning_rate).apply_gradients(zip(grads, params))
    sess.run(tf.compat.v1.global_variables_initializer())
    state = np.zeros(state_in.shape, np.float32)
    costs, norms = [], []
    for k in range(num_calls):
      window = rows[:, k * steps:(k + 1) * steps + 1]
      got, got_norm, state, _ = sess.run(
          [cost, norm, tf.stack(finals), train],
          {x: window[:, :-1], y: window[:, 1:], state_in: state})
      costs.append(got)
      norms.append(got_norm)
    return costs, norms, sess.run(params)


class TrainingTrajectoryTest(tf.test.TestCase):
  """Several training steps against the tutorial's, from the same weights.

  Equivalence tests compare this port's paths with each other; this one
  compares its whole update (hand-written gradients, clipping, learning
  rate, carried state) with an independent implementation, step by step,
  for each path a config takes: the BASIC wavefront (small, medium), BASIC
  layer by layer (hidden from 1024, large) and BLOCK, with the recurrent
  kernels (hidden 512, batch 8) where they run.
  """

  def _check(self, rnn_mode, chunk, hidden, batch,
             limits=plan_lib.THRESHOLDS):
    """Trains on the plan of `limits`, a wavefront of `chunk` steps or none.

    Returns:
      The plan (a plan.Step), and the graph's swapped products.
    """
    config = TinyConfig()
    config.hidden_size, config.batch_size = hidden, batch
    config.vocab_size, config.num_steps, num_calls = 40, 4, 5
    config.max_grad_norm, config.rnn_mode = 1.0, rnn_mode
    rows = np.random.RandomState(7).randint(
        0, config.vocab_size, (batch, num_calls * config.num_steps + 1))
    plan = training_plan(config, chunk, limits)
    with tf.Graph().as_default() as graph:
      model = build_tiny_model(config, rows, rnn_mode, seed=11, plan=plan)
      params = tf.compat.v1.trainable_variables()
      types = {op.type for op in graph.get_operations()}
      self.assertEqual("PanelMatMul" in types,
                       plan.lstm.forward == plan_lib.KERNELS)
      self.assertEqual("ApplyOuterProduct" in types,
                       plan.updates == plan_lib.FACTORS)
      swaps = [op for op in graph.get_operations() if op.type == "Transpose"
               and op.inputs[0].op.type == "MatMul"]
      with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  tf.compat.v1.local_variables_initializer()])
        model.assign_lr(sess, config.learning_rate)
        weights = sess.run(params)
        costs = [sess.run([model.cost, model.train_op, model.update_state])[0]
                 for _ in range(num_calls)]
        final = sess.run(params)
    want_costs, norms, want_final = _tutorial_training(weights, rows, config,
                                                       num_calls)
    # Steps with and without clipping both occur.
    self.assertGreater(max(norms), config.max_grad_norm)
    self.assertLess(min(norms), config.max_grad_norm)
    self.assertAllClose(costs, want_costs, rtol=2e-5)
    for got, want, w0, p in zip(final, want_final, weights, params):
      self.assertGreater(np.abs(want - w0).max(), 1e-4, msg=p.name)
      self.assertAllClose(got, want, rtol=1e-4, atol=2e-6, msg=p.name)
    return plan, swaps

  def testBasicWavefront(self):
    plan, _ = self._check(config_lib.BASIC, 2, hidden=16, batch=4)
    self.assertEqual(plan.lstm.paths, (plan_lib.WAVEFRONT,) * 2)

  def testBasicLayerByLayerOnTheRecurrentKernelsWhereOffered(self):
    # 4 steps: the kernels are asked for at any step count (and run where
    # the plan offers them: a CPU with AVX2 and a compiler).
    plan, _ = self._check(
        config_lib.BASIC, None, hidden=512, batch=8,
        limits=plan_lib.THRESHOLDS._replace(kernel_min_steps=0))
    self.assertEqual(plan.lstm.paths, (plan_lib.LAYER,) * 2)
    self.assertEqual(plan.lstm.forward == plan_lib.KERNELS,
                     plan_lib.offered().isa is not None)

  def testBlock(self):
    self._check(config_lib.BLOCK, None, hidden=16, batch=4)

  def testBlockWithDenseGradients(self):
    plan, _ = self._check(
        config_lib.BLOCK, None, hidden=16, batch=4,
        limits=plan_lib.THRESHOLDS._replace(factor_max_rows=0))
    self.assertEqual(plan.updates, plan_lib.DENSE)

  def testSwappedTransposedProducts(self):
    # Every a @ w^T of the backward pass swapped (transposed_product.py):
    # the softmax layer's, the layers' input gradients and, with 4 steps,
    # the per-step recurrent ones.
    limits = plan_lib.THRESHOLDS._replace(swap_min_weight=0)
    for mode, chunk in ((config_lib.BASIC, 2), (config_lib.BLOCK, None)):
      with self.subTest(mode=mode):
        plan, swaps = self._check(mode, chunk, hidden=16, batch=4,
                                  limits=limits)
        blocks = plan.lstm.input_gradients
        self.assertEqual((plan.softmax.input_gradient, plan.lstm.backward),
                         (plan_lib.SWAPPED, plan_lib.SWAPPED))
        self.assertEqual(blocks, (plan_lib.SWAPPED,) * len(blocks))
        # 1 softmax, 2 layers x (input gradients per block, 4 steps).
        self.assertLen(swaps, 1 + 2 * (len(blocks) + 4))


class RunTest(tf.test.TestCase):
  """main's runs in this process: what they print, save, restore and score."""

  def testTestModelOnGeneratedCorpusPrintsTheDocumentedLines(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = os.path.join(tmp, "data")
      os.mkdir(data)
      make_corpus(data)
      save = os.path.join(tmp, "save")
      args = ["--data_path=" + data, "--model=test", "--num_gpus=0",
              "--save_path=" + save]
      out, err, stop = run_in_process(args)
      self.assertIsNone(stop, err)
      lines = out.splitlines()
      for line in lines:
        self.assertTrue(any(re.fullmatch(f, line) for f in LINE_FORMATS),
                        "line of no format of LINE_FORMATS: %r" % line)
      self.assertEqual(lines[0], "Epoch: 1 Learning rate: 1.000")
      self.assertRegex(lines[-3], r"Test Perplexity: ")
      self.assertRegex(lines[-2], r"Peak RSS: ")
      self.assertEqual(lines[-1], "Saving model to %s." % save)
      # No meta graph: its constants would copy the corpus into every save.
      self.assertEqual([f for f in os.listdir(save) if f.endswith(".meta")],
                       [])
      events = [f for f in os.listdir(save) if f.startswith("events.")]
      self.assertNotEmpty(events)
      tags = set()
      for event in tf.compat.v1.train.summary_iterator(
          os.path.join(save, events[0])):
        tags.update(v.tag for v in event.summary.value)
      self.assertEqual(tags, {"Training Loss", "Learning Rate",
                              "Validation Loss"})
      self.assertIsNotNone(tf.train.latest_checkpoint(save))

      # A second run with the same --save_path restores the trained weights:
      # all epochs are done, so it only tests, with the same result.
      out2, err, stop = run_in_process(args)
      self.assertIsNone(stop, err)
      self.assertIn("Resuming from epoch 2 step 0 of %s" % save, out2)
      self.assertNotIn("wps", out2)
      test = re.findall(r"Test Perplexity: \S+", out)
      self.assertLen(test, 1)
      self.assertEqual(re.findall(r"Test Perplexity: \S+", out2), test)

  def testTestModelOnRealPtbBeatsTheUnigramModel(self):
    """The real corpus end to end: read and checked whole, trained on a tenth.

    A whole epoch of --model=test there is 23,239 steps of a softmax over
    10,000 words: it ends at test perplexity 464, which takes minutes. The
    first tenth of the training words (and of the validation words) with 16
    units and max_grad_norm 5 ends at 511, on the whole test file, where
    the unigram model of the training words scores 639 and a model that
    learned nothing (uniform) 10,000.
    """
    if PTB_PATH is None:
      self.skipTest(reader_test.NO_PTB)
    real_load_data, loaded = reader.load_data, []

    def load_data(*args):
      train, valid, test = real_load_data(*args)
      loaded.append((train, test))
      return train[:len(train) // 10], valid[:len(valid) // 10], test

    with mock.patch.object(reader, "load_data", load_data):
      out, err, stop = run_in_process([
          "--data_path=" + PTB_PATH, "--model=test", "--num_gpus=0",
          "--seed=1", "--config_overrides=hidden_size=16,max_grad_norm=5"])
    self.assertIsNone(stop, err)
    self.assertLen(loaded, 1)
    train, test = loaded[0]
    self.assertEqual((len(train), len(test)), (929589, 82430))
    unigram = unigram_perplexity(train, test)
    self.assertBetween(unigram, 600, 700)
    last = out.splitlines()[-2]
    match = re.fullmatch(r"Test Perplexity: (\d+\.\d{3})", last)
    self.assertIsNotNone(match, last)
    self.assertLess(float(match.group(1)), 0.9 * unigram)

  def testFp16LearnsInBothCpuModes(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_structured_corpus(tmp)
      for mode in ("BASIC", "BLOCK"):
        dtypes = set()
        real_run_epoch = ptb_word_lm.run_epoch

        def run_epoch(session, model, *args, **kwargs):
          weights = session.graph.get_collection(
              tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
          dtypes.update(v.dtype.base_dtype for v in weights)
          return real_run_epoch(session, model, *args, **kwargs)

        out, err, stop = run_in_process(
            learning_args(tmp, seed=1) + ["--use_fp16", "--rnn_mode=" + mode],
            run_epoch)
        self.assertIsNone(stop, err)
        self.assertEqual(dtypes, {tf.float16}, mode)
        test = float(re.search(r"Test Perplexity: (\S+)", out).group(1))
        # Measured: 2.3 to 2.5 (float32: 2.3), against 11 for the unigram
        # model (StructuredCorpusTest).
        self.assertLess(test, LEARNED_TEST_PERPLEXITY, mode)


class ProgressLineTest(InProcessRunTest):
  """The progress lines of training, parsed and checked against the steps.

  run_epoch prints about ten lines a pass: at step 10 % every and every
  `every` steps from there, every = epoch_size // 10 (each step of a pass
  shorter than ten steps). Each gives the fraction of the pass done before
  the step (step / epoch_size), the perplexity of the steps so far and the
  speed of the pass so far.
  """

  def _run(self, args):
    """Runs main; returns (stdout, the training passes' steps).

    Each training pass is (its PTBInput, [(step, cost) of each session
    call]), as run_epoch hands them to on_step; the test sums the costs
    itself.
    """
    passes, real_run_epoch = [], ptb_word_lm.run_epoch

    def run_epoch(session, model, eval_op=None, verbose=False, start=None,
                  on_step=None):
      if eval_op is None:
        return real_run_epoch(session, model, eval_op, verbose, start,
                              on_step)
      steps = []
      passes.append((model.input, steps))

      def record(step, cost, costs):
        steps.append((step, cost))
        on_step(step, cost, costs)

      return real_run_epoch(session, model, eval_op, verbose, start, record)

    out, err, stop = run_in_process(args, run_epoch)
    self.assertIsNone(stop, err)
    return out, passes

  def assertProgressLines(self, out, passes):
    """Checks every epoch's progress lines; returns their count per epoch."""
    epochs = re.split(r"^Epoch: \d+ Learning rate: .*$", out, flags=re.M)[1:]
    self.assertLen(epochs, len(passes))
    counts = []
    for epoch, (data, steps) in zip(epochs, passes):
      self.assertEqual([s for s, _ in steps], list(range(data.epoch_size)))
      sums = np.cumsum([cost for _, cost in steps])
      every = max(1, data.epoch_size // 10)
      printed = [(s, sums[s]) for s, _ in steps if s % every == 10 % every]
      lines = re.findall(r"^(\S+) perplexity: (\S+) speed: (\S+) wps$",
                         epoch, re.M)
      self.assertLen(lines, len(printed), epoch)
      for (step, costs), (fraction, perplexity, speed) in zip(printed, lines):
        self.assertEqual(fraction, "%.3f" % (step / data.epoch_size))
        self.assertTrue(np.isfinite(float(perplexity)))
        self.assertAllClose(
            float(perplexity),
            np.exp(costs / ((step + 1) * data.num_steps)), atol=1e-3)
        self.assertGreater(float(speed), 0)
      fractions = [float(f) for f, _, _ in lines]
      self.assertEqual(fractions, sorted(set(fractions)))  # increasing
      train = re.search(r"^Epoch: \d+ Train Perplexity: (\S+)$", epoch, re.M)
      self.assertAllClose(
          float(train.group(1)),
          np.exp(sums[-1] / (data.epoch_size * data.num_steps)),
          atol=1e-3)
      counts.append(len(lines))
    return counts

  def testAboutTenLinesAnEpoch(self):
    # 67 steps an epoch: every 6 steps from step 4, 11 lines.
    out, passes = self._run(learning_args(self.data))
    self.assertEqual([d.epoch_size for d, _ in passes], [67] * 3)
    self.assertEqual(self.assertProgressLines(out, passes), [11] * 3)

  def testShortEpochsPrintEveryStepWithoutDividingByZero(self):
    # The original printed at step % (epoch_size // 10) == 10: a division
    # by zero below ten steps.
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp, train_lines=30)
      out, passes = self._run(["--data_path=" + tmp, "--model=test",
                               "--num_gpus=0"])
    self.assertLen(passes, 1)
    data = passes[0][0]
    self.assertBetween(data.epoch_size, 2, 9)
    self.assertEqual(self.assertProgressLines(out, passes), [data.epoch_size])


def write_random_corpus(directory, sizes, vocab_size, seed=3):
  """Writes the three PTB files as one line of random words each.

  Valid and test draw only words of the training file, which the reader
  would drop otherwise.

  Args:
    directory: where.
    sizes: the ids of the train, valid and test files, <eos> included.
    vocab_size: the words drawn from, <eos> included.
    seed: the random seed.

  Returns:
    The directory.
  """
  rng = np.random.RandomState(seed)
  train = rng.randint(0, vocab_size - 1, size=sizes[0] - 1)
  files = [train] + [rng.choice(np.unique(train), size=n - 1)
                     for n in sizes[1:]]
  for name, words in zip(reader.FILE_NAMES, files):
    with open(os.path.join(directory, name), "w") as f:
      f.write(" ".join("w%d" % i for i in words) + "\n")
  return directory


def tiny_args(data, **changes):
  """The command line of a run of TinyConfig with `changes` on `data`."""
  fields = dict(num_layers=2, num_steps=5, hidden_size=8, batch_size=4,
                vocab_size=TinyConfig.vocab_size, max_grad_norm=5)
  fields.update(changes)
  return ["--data_path=" + data, "--model=test", "--num_gpus=0",
          "--rnn_mode=basic", "--seed=1", "--eval_unroll=4",
          "--config_overrides=" + ",".join("%s=%s" % kv
                                           for kv in fields.items())]


class LibraryPagesTest(tf.test.TestCase):

  def testReleasedAfterStartupAndAfterEachGraphsFirstCall(self):
    # Two epochs: the training and validation graphs run twice, yet their
    # first calls are what ran code only once.
    watches, calls = [], []

    class RecordingWatch(Watch):

      def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        watches.append(self)

    def release():
      where = watches[-1].where
      calls.append((where.phase, where.epoch, where.step))
      return 0.0

    with tempfile.TemporaryDirectory() as tmp, \
        mock.patch.object(monitor, "release_library_pages", release), \
        mock.patch.object(ptb_word_lm, "Watch", RecordingWatch):
      _, err, stop = run_in_process(tiny_args(write_random_corpus(
          tmp, (400, 60, 30), TinyConfig.vocab_size), max_max_epoch=2))
    self.assertIsNone(stop, err)
    self.assertEqual(calls, [("startup", 0, 0), ("train", 1, 0),
                             ("valid", 1, 0), ("test", 2, 0)])


class LearningRateScheduleTest(tf.test.TestCase):

  def testEachEpochsUpdateUsesTheScheduledRate(self):
    # One training step an epoch, always clipped: the weights then move by
    # exactly rate x max_grad_norm (global norm), whatever the gradient.
    config = TinyConfig()
    config.max_epoch, config.max_max_epoch, config.lr_decay = 2, 5, 0.5
    config.max_grad_norm = 0.01
    moved = []
    real_run_epoch = ptb_word_lm.run_epoch

    def run_epoch(session, model, eval_op=None, **kwargs):
      if eval_op is None:
        return real_run_epoch(session, model, eval_op, **kwargs)
      self.assertEqual(model.input.epoch_size, 1)
      weights = session.graph.get_collection(
          tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
      before = session.run(weights)
      result = real_run_epoch(session, model, eval_op, **kwargs)
      moved.append(np.sqrt(sum(np.sum(np.square(a - b)) for a, b in
                               zip(session.run(weights), before))))
      return result

    with tempfile.TemporaryDirectory() as tmp:
      _, err, stop = run_in_process(tiny_args(
          write_random_corpus(tmp, (30, 30, 20), config.vocab_size),
          max_epoch=config.max_epoch, max_max_epoch=config.max_max_epoch,
          lr_decay=config.lr_decay, max_grad_norm=config.max_grad_norm),
                                    run_epoch)
    self.assertIsNone(stop, err)
    self.assertAllClose(np.array(moved) / config.max_grad_norm,
                        [1.0, 1.0, 0.5, 0.25, 0.125], rtol=1e-3)


class EntryPointTest(tf.test.TestCase):
  """ptb_word_lm.py as a program, in one process that a usage error ends.

  The one sample of how the program reports any user error (ErrorTest and
  the modules' tests check each error where it is raised), and of what the
  program imports: -X importtime lists every module on stderr.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", SCRIPT, "--data_path=/x",
         "--num_gpus=0", "--model=huge"],
        capture_output=True, text=True, timeout=600, cwd=HERE)
    cls.proc = proc
    cls.imported = [line.rsplit("|", 1)[-1].strip()
                    for line in proc.stderr.splitlines()
                    if line.startswith("import time:")]
    cls.stderr = [line for line in proc.stderr.splitlines()
                  if not line.startswith("import time:")]

  def testUserErrorIsOneLineWithItsExitCode(self):
    self.assertEqual(self.proc.returncode, 2, self.proc.stderr[-2000:])
    self.assertEqual(self.proc.stdout, "")
    self.assertNotIn("Traceback", self.proc.stderr)
    # The last line, and the program's only one: TensorFlow's start-up
    # lines may come before it.
    line = ("ptb_word_lm.py: error: Invalid model: huge; valid values are "
            "small, medium, large, test")
    self.assertEqual(self.stderr[-1], line)
    self.assertEqual([l for l in self.stderr if "ptb_word_lm.py" in l], [line])

  def testKerasStaysOut(self):
    # TensorFlow imports Keras unless the program stops it first
    # (monitor.reduce_memory_footprint); benchmark_test checks benchmark.py.
    self.assertIn("tensorflow", self.imported)
    self.assertEqual([m for m in self.imported if m.split(".")[0] == "keras"],
                     [])



class StartupInterruptTest(tf.test.TestCase):
  """Ctrl-C and SIGTERM while TensorFlow is imported or the run is built.

  Each case starts the program as a terminal's foreground job has it
  (SIGINT at its default action), signals it at a point of its start-up,
  and then runs the same command again, which must run cleanly to its end.
  """

  def _start(self, args):
    # Unbuffered, so that a line on stdout is there when it is printed.
    return subprocess.Popen(
        [sys.executable, SCRIPT] + args, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=HERE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

  def testOneLineAtEveryPointAndTheNextRunStartsCleanly(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = make_corpus(tmp)
      args = ["--data_path=" + data, "--model=test", "--num_gpus=0",
              "--save_path=" + os.path.join(tmp, "save"),
              "--summary_json=" + os.path.join(tmp, "run.json"),
              "--memory_log=" + os.path.join(tmp, "memory.csv")]
      # (the stream and what it shows when the signal is sent, seconds
      # after it, the signal): in the import of TensorFlow, after the config
      # (the corpus and the resume next), at the plan (the graph next), in
      # the session's first epoch. The last waits for a line rather than a
      # time: a fast CPU trains this config in well under a second. Each run
      # is the same command as the one it follows, and reaches its own
      # point: it started cleanly.
      for stream, marker, delay, signum in (
          ("stderr", None, 0.3, signal.SIGINT),
          ("stderr", "rnn_mode:", 0, signal.SIGINT),
          ("stderr", "Plan:", 0, signal.SIGTERM),
          ("stdout", "Epoch: 1 Learning rate", 0, signal.SIGINT)):
        with self.subTest(marker=marker, delay=delay, signal=signum.name):
          proc = self._start(args)
          seen = {"stdout": [], "stderr": []}
          if marker:
            for line in getattr(proc, stream):
              seen[stream].append(line)
              if marker in line:
                break
            self.assertIn(marker, "".join(seen[stream]))
          time.sleep(delay)
          proc.send_signal(signum)
          out, rest = proc.communicate(timeout=300)
          out = "".join(seen["stdout"]) + out
          err = "".join(seen["stderr"]) + rest
          self.assertEqual(proc.returncode, 128 + signum, err)
          self.assertNotIn("Traceback", err)
          mine = [l for l in err.splitlines() if "ptb_word_lm.py" in l]
          self.assertLen(mine, 1, err)
          self.assertRegex(mine[0], r"^ptb_word_lm.py: interrupted by %s "
                           % signum.name)
          if stream == "stdout":  # the training loop's own line
            self.assertIn(" pass of epoch 1 at step ", mine[0])
          self.assertEqual(err.splitlines()[-1], mine[0])
          self.assertNotIn("Test Perplexity", out)
          self.assertEqual([n for n in os.listdir(tmp) if ".tmp" in n], [])
      again = subprocess.run([sys.executable, SCRIPT] + args,
                             capture_output=True, text=True, cwd=HERE,
                             timeout=600)
      self.assertEqual(again.returncode, 0, again.stderr)
      self.assertIn("Test Perplexity", again.stdout)
      with open(os.path.join(tmp, "run.json")) as f:
        self.assertEqual(json.load(f)["status"], "finished")


class FlagsTest(tf.test.TestCase):

  def testShortHelpListsTheAdoptedFlags(self):
    # --helpshort lists the main module's key flags: its own and those of
    # ptb/extra_flags.py, which it adopts.
    text = ptb_word_lm.FLAGS.module_help(ptb_word_lm)
    for flag in ("--data_path", "--rnn_mode", "--save_every_steps",
                 "--eval_unroll", "--memory_log"):
      self.assertIn(flag, text)


class ErrorTest(tf.test.TestCase):
  """The user errors of the model, the modes, the config and the devices.

  Each checked once, in this process, where it is raised, with its exit code
  (2 for usage errors, else 1); and main's own. The corpus's errors are
  reader_test's, the outputs' and the flags' ranges ptb/outputs_test's, the
  cluster's ptb/cluster_test's; that a refused run writes nothing is
  ptb/training_test's BadInputTest; how the program prints them all is
  EntryPointTest's.
  """

  def assertUserError(self, call, pattern, code):
    with self.assertRaisesRegex(UserError, pattern) as e:
      call()
    self.assertEqual(e.exception.exit_code, code)
    return e.exception

  def testUnknownModel(self):
    self.assertUserError(lambda: ptb_word_lm.get_config("huge"),
                         r"^Invalid model: huge; valid values are small, "
                         r"medium, large, test$", 2)

  def testUnknownRnnModeNamesWhereItComesFrom(self):
    modes = r"; valid values are AUTO, BASIC, BLOCK, CUDNN \(any case\)$"
    self.assertUserError(lambda: ptb_word_lm.get_config("test", "fancy"),
                         r"^Invalid --rnn_mode=fancy" + modes, 2)
    self.assertUserError(
        lambda: config_lib.apply_overrides(ptb_word_lm.get_config("test"),
                                           "rnn_mode=fancy"),
        r"^Invalid --config_overrides rnn_mode=fancy" + modes, 2)
    with mock.patch.object(ptb_word_lm.TestConfig, "rnn_mode", "Fancy"):
      self.assertUserError(
          lambda: config_lib.resolve_config(ptb_word_lm.get_config("test"),
                                            0, None),
          r"^Invalid config rnn_mode=Fancy" + modes, 2)

  def testUnknownOverrideNamesTheFields(self):
    self.assertUserError(
        lambda: config_lib.apply_overrides(ptb_word_lm.get_config("test"),
                                           "max_epoch=1,max_epochs=1"),
        r"^--config_overrides: unknown field 'max_epochs' in 'max_epochs=1'; "
        r"fields are batch_size, hidden_size, init_scale, keep_prob, "
        r"learning_rate, lr_decay, max_epoch, max_grad_norm, max_max_epoch, "
        r"num_layers, num_steps, rnn_mode, vocab_size$", 2)

  def testNonPositiveAbsurdAndOutOfRangeValues(self):
    for override, pattern in (
        ("num_steps=0", r"^config num_steps=0 must be a positive integer$"),
        ("hidden_size=-4", r"^config hidden_size=-4 must be a positive "
         r"integer$"),
        ("learning_rate=0", r"^config learning_rate=0.0 must be a positive "
         r"number$"),
        ("init_scale=nan", r"^config init_scale=nan must be a positive "
         r"number$"),
        ("hidden_size=1000000000", r"^config hidden_size=1000000000 is "
         r"absurdly large \(more than 100000\)$"),
        ("batch_size=10000000", r"^config batch_size=10000000 is absurdly "
         r"large \(more than 1000000\)$"),
        ("keep_prob=0", r"^config keep_prob=0.0 must be in \(0, 1\]$"),
        ("keep_prob=1.5", r"^config keep_prob=1.5 must be in \(0, 1\]$")):
      self.assertUserError(
          functools.partial(config_lib.resolve_config,
                            ptb_word_lm.get_config("test"), 0, override),
          pattern, 2)

  def testGpusAskedForWithoutAGpu(self):
    if tf.config.list_physical_devices("GPU"):
      self.skipTest("this machine has a GPU")
    self.assertUserError(
        lambda: devices_lib.check_devices(2, config_lib.BASIC, 1),
        r"^--num_gpus=2 but this machine has 0 GPUs visible to TensorFlow; "
        r"use --num_gpus=0 to train on the CPU$", 1)
    self.assertUserError(
        lambda: devices_lib.check_devices(0, config_lib.CUDNN, 1),
        r"^--rnn_mode=CUDNN needs a GPU \(cuDNN\) and --num_gpus >= 1; on "
        r"the CPU use BASIC or BLOCK$", 1)
    # --num_gpus is 1 unless given, as in the original: main refuses it on
    # a machine without a GPU before it reads the corpus.
    _, _, stop = run_in_process(["--data_path=/nonexistent"])
    self.assertIsInstance(stop, UserError)
    self.assertEqual(str(stop), "--num_gpus=1 but this machine has 0 GPUs "
                     "visible to TensorFlow; use --num_gpus=0 to train on "
                     "the CPU")

  def testBlankAndByteOrderMarkedCorporaThroughTheCommandLine(self):
    with tempfile.TemporaryDirectory() as tmp:
      plain, marked, blank = (os.path.join(tmp, n)
                              for n in ("plain", "marked", "blank"))
      for d in (plain, marked, blank):
        os.mkdir(d)
        make_corpus(d)
      with open(os.path.join(blank, "ptb.train.txt"), "w") as f:
        f.write("\n" * 3000)
      for name in ("train", "valid", "test"):
        path = os.path.join(marked, "ptb.%s.txt" % name)
        with open(path, "rb") as f:
          text = f.read()
        with open(path, "wb") as f:
          f.write(b"\xef\xbb\xbf" + text)
      args = ["--model=test", "--num_gpus=0", "--seed=1"]
      _, _, stop = run_in_process(["--data_path=" + blank] + args)
      self.assertIsInstance(stop, UserError)
      self.assertRegex(str(stop), "ptb.train.txt holds no words, only 3000 "
                       "line ends$")
      outs = []
      for d in (plain, marked):
        out, err, stop = run_in_process(["--data_path=" + d] + args)
        self.assertIsNone(stop, err)
        outs.append(re.sub(r"speed: \d+ wps", "", out))
      self.assertIn("Test Perplexity", outs[0])
      self.assertEqual(outs[1], outs[0])

  def testOverridesAreAnnouncedOnlyOnceChecked(self):
    out, _, stop = run_in_process([
        "--data_path=/nonexistent", "--num_gpus=0", "--model=test",
        "--config_overrides=learning_rate=nan"])
    self.assertIsInstance(stop, UserError)
    self.assertEqual(str(stop), "config learning_rate=nan must be a positive "
                     "number")
    self.assertEqual(out, "")

  def testSaveEveryStepsIsForOneProcess(self):
    _, _, stop = run_in_process([
        "--data_path=/nonexistent", "--num_gpus=0", "--job_name=worker",
        "--ps_hosts=127.0.0.1:1", "--worker_hosts=127.0.0.1:2",
        "--save_every_steps=10"])
    self.assertIsInstance(stop, UserError)
    self.assertEqual(str(stop), "--save_every_steps is for one process: a "
                     "cluster saves at the end of every epoch")
    self.assertEqual(stop.exit_code, 2)


class ConfigTest(tf.test.TestCase):

  def testGetConfigIsFreshAndTakesRnnMode(self):
    a = ptb_word_lm.get_config("small")
    a.hidden_size = 3
    b = ptb_word_lm.get_config("small", "BaSiC")
    self.assertEqual(b.hidden_size, 200)
    self.assertEqual(b.rnn_mode, ptb_word_lm.BASIC)

  def testOverridesPrintAndApply(self):
    config = ptb_word_lm.get_config("large")
    changed = config_lib.apply_overrides(
        config, "max_epoch=1, max_max_epoch=2,keep_prob=0.5,rnn_mode=basic")
    self.assertEqual(changed, {"max_epoch": 1, "max_max_epoch": 2,
                               "keep_prob": 0.5, "rnn_mode": "basic"})
    self.assertEqual((config.max_epoch, config.max_max_epoch), (1, 2))
    self.assertIsInstance(config.max_epoch, int)

  def _resolved(self, overrides=None, **class_edits):
    """TestConfig, its class edited in place by `class_edits`, resolved."""
    edited = (mock.patch.multiple(ptb_word_lm.TestConfig, **class_edits)
              if class_edits else contextlib.nullcontext())
    with edited:
      return config_lib.resolve_config(ptb_word_lm.get_config("test"), 0,
                                       overrides)

  def testRatesTakeIntsAndFloatsAndStayFloats(self):
    # max_grad_norm = 1 and keep_prob = 1.0 stand in the class.
    for overrides, edits, want in (
        ("max_grad_norm=2.5", {}, 2.5), ("max_grad_norm=3", {}, 3.0),
        (None, {"max_grad_norm": 2.5}, 2.5), (None, {"max_grad_norm": 3}, 3.0),
        ("keep_prob=1", {}, 1.0), (None, {"keep_prob": 1}, 1.0)):
      config = self._resolved(overrides, **edits)
      name = (overrides or next(iter(edits))).split("=")[0]
      value = getattr(config, name)
      self.assertEqual(value, want, msg=(overrides, edits))
      self.assertIsInstance(value, float, msg=(overrides, edits))

  def testSizesTakeWholeNumbersOnly(self):
    self.assertEqual(self._resolved("num_steps=7").num_steps, 7)
    self.assertEqual(self._resolved(num_steps=7).num_steps, 7)
    for overrides, edits, pattern in (
        ("num_steps=2.5", {}, r"^--config_overrides: num_steps=2\.5 must be a "
         r"whole number \(a size or a count\)$"),
        ("hidden_size=1e3", {}, r"^--config_overrides: hidden_size=1e3 must "
         r"be a whole number"),
        (None, {"num_steps": 2.5}, r"^config num_steps=2\.5 must be a whole "
         r"number \(a size or a count\)$"),
        (None, {"batch_size": 20.0}, r"^config batch_size=20\.0 must be a "
         r"whole number"),
        ("learning_rate=fast", {}, r"^--config_overrides: learning_rate=fast "
         r"must be a number$")):
      with self.assertRaisesRegex(UserError, pattern) as e:
        self._resolved(overrides, **edits)
      self.assertEqual(e.exception.exit_code, 2)

  def testEveryFieldHasAKind(self):
    # The checks read config.FIELDS alone: it must name every field of
    # every class, and no other, each with one of the kinds.
    for config in list(ptb_word_lm.CONFIGS.values()) + [TinyConfig]:
      self.assertCountEqual(config_lib.config_fields(config),
                            config_lib.FIELDS, msg=config.__name__)
    self.assertContainsSubset({kind for kind, _ in config_lib.FIELDS.values()},
                              config_lib.KINDS)

  def testAFieldWithoutAKindIsRefused(self):
    # As a field appended to a class, but not to config.FIELDS, would be;
    # through an override of another field too.
    kinds = (r"^config field dropout_seed of TestConfig has no kind: add it "
             r"to FIELDS in ptb/config\.py as a size, count, rate, "
             r"probability or mode$")
    with mock.patch.object(ptb_word_lm.TestConfig, "dropout_seed", 7,
                           create=True):
      for overrides in (None, "max_epoch=1"):
        with self.assertRaisesRegex(UserError, kinds) as e:
          self._resolved(overrides)
        self.assertEqual(e.exception.exit_code, 2)
    # And a field of config.FIELDS that a class lacks.
    fields = config_lib.config_fields(ptb_word_lm.TestConfig)
    del fields["vocab_size"]
    with self.assertRaisesRegex(UserError, r"^config Unfinished has no "
                                r"field vocab_size$"):
      config_lib.validate_config(type("Unfinished", (), fields)())

  def testTheTutorialsValues(self):
    expected = {
        "small": (0.1, 5, 2, 20, 200, 4, 13, 1.0, 0.5),
        "medium": (0.05, 5, 2, 35, 650, 6, 39, 0.5, 0.8),
        "large": (0.04, 10, 2, 35, 1500, 14, 55, 0.35, 1 / 1.15),
        "test": (0.1, 1, 1, 2, 2, 1, 1, 1.0, 0.5),
    }
    fields = ("init_scale", "max_grad_norm", "num_layers", "num_steps",
              "hidden_size", "max_epoch", "max_max_epoch", "keep_prob",
              "lr_decay")
    for name, values in expected.items():
      config = ptb_word_lm.get_config(name)
      self.assertEqual(tuple(getattr(config, f) for f in fields), values)
      # The tutorial's classes ran BLOCK, which AUTO runs on GPUs; on the
      # CPU it runs BASIC, this port's fastest mode there (README, Configs).
      self.assertEqual((config.learning_rate, config.batch_size,
                        config.vocab_size, config.rnn_mode),
                       (1.0, 20, 10000, ptb_word_lm.AUTO))
    self.assertEqual(config_lib.auto_rnn_mode(num_gpus=1), ptb_word_lm.BLOCK)
    self.assertEqual(config_lib.auto_rnn_mode(num_gpus=0), ptb_word_lm.BASIC)

  def _run_edited(self, class_edits, *args):
    """Runs main with TestConfig edited by `class_edits`, as a user would.

    Returns:
      (the summary's fields, the shape of the first layer's bias in the
      checkpoint, the lines logged).
    """
    edited = (mock.patch.multiple(ptb_word_lm.TestConfig, **class_edits)
              if class_edits else contextlib.nullcontext())
    with tempfile.TemporaryDirectory() as tmp, edited, \
        self.assertLogs(logging.get_absl_logger(), "INFO") as logs:
      save, summary = os.path.join(tmp, "save"), os.path.join(tmp, "s.json")
      _, err, stop = run_in_process(
          ["--data_path=" + make_corpus(tmp, train_lines=30), "--model=test",
           "--num_gpus=0", "--save_path=" + save,
           "--summary_json=" + summary] + list(args))
      self.assertIsNone(stop, err)
      with open(summary) as f:
        fields = json.load(f)
      bias = tf.train.load_checkpoint(save).get_variable_to_shape_map()[
          "Model/RNN/cell_0/bias"]
    return fields, bias, logs.output

  def testAClassEditedInPlaceIsWhatRuns(self):
    fields, bias, log = self._run_edited(
        dict(rnn_mode=ptb_word_lm.BLOCK, hidden_size=3))
    self.assertEqual(fields["rnn_mode"], "BLOCK")
    self.assertEqual(fields["config"]["hidden_size"], 3)
    self.assertEqual(bias, [12])                    # 4 gates x 3 units
    self.assertIn("INFO:absl:rnn_mode: BLOCK", log)
    # The flag still overrides the class.
    fields, _, log = self._run_edited(dict(rnn_mode=ptb_word_lm.BLOCK),
                                      "--rnn_mode=basic")
    self.assertEqual(fields["rnn_mode"], "BASIC")
    self.assertIn("INFO:absl:rnn_mode: BASIC", log)
    fields, bias, log = self._run_edited({})
    self.assertEqual(fields["rnn_mode"], "BASIC")
    self.assertEqual(bias, [8])
    self.assertIn("INFO:absl:rnn_mode: BASIC (AUTO on the CPU)", log)


if __name__ == "__main__":
  tf.test.main()
