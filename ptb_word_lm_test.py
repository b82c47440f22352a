"""Tests of the model, the training step and the command line of ptb_word_lm.py."""

import copy
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

import lstm_kernels
import monitor
import ptb_word_lm
import reader
import reader_test
import util

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ptb_word_lm.py")
PTB_PATH = reader_test.PTB_PATH


def make_corpus(directory, num_words=30, train_lines=300, seed=0,
                word_prefix="w"):
  """Writes a small generated PTB-like corpus; returns the directory."""
  rng = np.random.RandomState(seed)
  words = ["%s%d" % (word_prefix, i) for i in range(num_words)]
  for name, lines in (("train", train_lines), ("valid", 40), ("test", 40)):
    with open(os.path.join(directory, "ptb.%s.txt" % name), "w") as f:
      for _ in range(lines):
        # A skewed distribution, so that a model has something to learn.
        ids = np.minimum(rng.geometric(0.15, size=rng.randint(3, 12)) - 1,
                         num_words - 1)
        f.write(" " + " ".join(words[i] for i in ids) + " \n")
  return directory


def make_structured_corpus(directory, train_lines=1500, num_words=10, seed=0,
                           period=2, length=8):
  """Writes a corpus that only a model carrying its LSTM state can learn.

  Every line repeats `period` words drawn at random (`a b a b a b a b`), so
  each word after the first `period` is the word `period` steps back, and
  is independent of the word just before it: a model that sees only the
  current word (one that loses its state) does no better than the unigram
  model, one that remembers the previous words predicts most of them.
  With `LEARNING_OVERRIDES` on --model=test (2 steps a window), half of
  those dependencies cross from one window to the next.

  Returns:
    The directory.
  """
  rng = np.random.RandomState(seed)
  words = ["s%d" % i for i in range(num_words)]
  for name, lines in (("train", train_lines), ("valid", 200), ("test", 100)):
    with open(os.path.join(directory, "ptb.%s.txt" % name), "w") as f:
      for _ in range(lines):
        ids = np.resize(rng.randint(num_words, size=period), length)
        f.write(" " + " ".join(words[i] for i in ids) + " \n")
  return directory


# --model=test made big enough to learn make_structured_corpus (10 words and
# <eos>) in a few seconds.
LEARNING_OVERRIDES = ("hidden_size=16,vocab_size=11,max_epoch=2,"
                      "max_max_epoch=3,max_grad_norm=5")
# A test perplexity below this shows that the model learned what needs its
# state (the corpus test shows the unigram model and a model that loses its
# state at every step above 9).
LEARNED_TEST_PERPLEXITY = 4.0


def run_script(*args, timeout=600):
  """Runs ptb_word_lm.py; returns (exit code, stdout, stderr)."""
  proc = subprocess.run([sys.executable, SCRIPT] + list(args),
                        capture_output=True, text=True, timeout=timeout,
                        cwd=HERE)
  return proc.returncode, proc.stdout, proc.stderr


class TinyConfig(object):
  init_scale = 0.1
  learning_rate = 1.0
  max_grad_norm = 5
  num_layers = 2
  num_steps = 5
  hidden_size = 8
  max_epoch = 1
  max_max_epoch = 1
  keep_prob = 1.0
  lr_decay = 0.5
  batch_size = 4
  vocab_size = 30
  rnn_mode = ptb_word_lm.BASIC


# BlockLSTM with TensorFlow's registered gradient (BlockLSTMGrad): an
# independent reference for the hand-written backward pass of both modes.
REGISTERED = "block_lstm_registered_gradient"


def layer_outputs(rnn_mode, inputs, dtype=tf.float32):
  """One LSTM layer's outputs and gradients for numpy inputs."""
  x, c0, h0, kernel, bias, dy, dc, dh = (tf.constant(v, dtype) for v in inputs)
  if rnn_mode == REGISTERED:
    block = ptb_word_lm._block_lstm(x, c0, h0, kernel, bias)
    outputs, state = block[6], util.LSTMStateTuple(block[1][-1], block[6][-1])
  else:
    outputs, state = ptb_word_lm.lstm_layer(
        rnn_mode, x, util.LSTMStateTuple(c0, h0), kernel, bias)
  # A loss that weighs every output and the final state differently.
  loss = (tf.reduce_sum(outputs * dy) + tf.reduce_sum(state.c * dc) +
          tf.reduce_sum(state.h * dh))
  grads = tf.compat.v1.gradients(loss, [x, c0, h0, kernel, bias])
  return [outputs, state.c, state.h] + grads


class _DLPackBuffer(object):
  """An eager tensor's own buffer, in the form np.from_dlpack takes."""

  def __init__(self, tensor):
    self._capsule = tf.experimental.dlpack.to_dlpack(tensor)

  def __dlpack__(self, stream=None, **_):
    return self._capsule

  def __dlpack_device__(self):
    return (1, 0)   # kDLCPU, device 0


def buffer_address(tensor):
  """The address of an eager CPU tensor's data, not of a copy."""
  return np.from_dlpack(_DLPackBuffer(tensor)).ctypes.data


def random_layer_inputs(num_steps=6, batch=3, input_size=4, hidden=5, seed=1):
  rng = np.random.RandomState(seed)
  shapes = ([num_steps, batch, input_size], [batch, hidden], [batch, hidden],
            [input_size + hidden, 4 * hidden], [4 * hidden],
            [num_steps, batch, hidden], [batch, hidden], [batch, hidden])
  return [rng.uniform(-1, 1, size=s) for s in shapes]


def reference_lstm(x, c, h, kernel, bias):
  """The LSTM in numpy, straight from the SPEC: gates (i, j, f, o)."""
  sigmoid = lambda v: 1 / (1 + np.exp(-v))
  outputs = []
  for x_t in x:
    gates = np.concatenate([x_t, h], 1) @ kernel + bias
    i, j, f, o = np.split(gates, 4, axis=1)
    c = sigmoid(f + 0.0) * c + sigmoid(i) * np.tanh(j)
    h = sigmoid(o) * np.tanh(c)
    outputs.append(h)
  return np.stack(outputs), c, h


class LstmLayerTest(tf.test.TestCase):

  def testModesMatchNumpyReference(self):
    inputs = random_layer_inputs()
    want = reference_lstm(*inputs[:5])
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        got = sess.run(layer_outputs(mode, inputs)[:3])
      for g, w in zip(got, want):
        self.assertAllClose(g, w, rtol=1e-5, atol=1e-6, msg=mode)

  def testBasicAndBlockEqualBlockLstmWithItsRegisteredGradient(self):
    inputs = random_layer_inputs()
    results = {}
    for mode in (REGISTERED, ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        results[mode] = sess.run(layer_outputs(mode, inputs))
    names = ["outputs", "c", "h", "d_x", "d_c0", "d_h0", "d_kernel", "d_bias"]
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      for name, got, want in zip(names, results[mode], results[REGISTERED]):
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6,
                            msg="%s %s" % (mode, name))

  def testGradientsAgreeWithNumericalGradient(self):
    # Float64 numerics in the reference, float32 in the ops: the numerical
    # gradient is taken in float32 with a step that float32 resolves.
    inputs = random_layer_inputs(num_steps=3, batch=2, input_size=3, hidden=2)
    for mode in (ptb_word_lm.BLOCK, ptb_word_lm.BASIC):
      with tf.Graph().as_default(), tf.compat.v1.Session():
        x, c0, h0, kernel, bias = (tf.constant(v, tf.float32)
                                   for v in inputs[:5])
        dy = tf.constant(inputs[5], tf.float32)
        outputs, state = ptb_word_lm.lstm_layer(
            mode, x, util.LSTMStateTuple(c0, h0), kernel, bias)
        loss = tf.reduce_sum(outputs * dy) + tf.reduce_sum(state.c)
        for var in (x, c0, h0, kernel, bias):
          err = tf.compat.v1.test.compute_gradient_error(
              var, var.shape.as_list(), loss, [], delta=1e-3)
          self.assertLess(err, 2e-3, msg="%s %s" % (mode, var.name))

  def testBackwardCopiesOnlyTheRecurrentWeightsTransposed(self):
    """The backward pass transposes w_h once and its step matmuls use it.

    A transposed copy of the whole kernel kept 2 x 69 MiB more alive in the
    large model's step. A Transpose that feeds MatMuls directly is folded
    back into transpose_b=True by Grappler (the folded nodes are named
    FoldTransposeIntoMatMul), which would make the copy useless. Placeholders,
    so that Grappler cannot fold the whole computation into constants.
    """
    inputs = random_layer_inputs(input_size=4, hidden=5)
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        feeds = [tf.compat.v1.placeholder(tf.float32, v.shape)
                 for v in inputs]
        x, c0, h0, kernel, bias, dy, _, _ = feeds
        outputs, _ = ptb_word_lm.lstm_layer(
            mode, x, util.LSTMStateTuple(c0, h0), kernel, bias)
        grads = tf.compat.v1.gradients(outputs, [x, kernel], grad_ys=dy)
        metadata = tf.compat.v1.RunMetadata()
        sess.run(grads, feed_dict=dict(zip(feeds, inputs)),
                 options=tf.compat.v1.RunOptions(
                     trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                 run_metadata=metadata)
      nodes = [n for d in metadata.step_stats.dev_stats for n in d.node_stats]
      # timeline_label: "name = OpType(inputs)".
      transposed = [[dim.size for dim in out.tensor_description.shape.dim]
                    for n in nodes
                    if n.timeline_label.split(" = ")[-1].startswith(
                        ("Transpose", "_MklTranspose"))
                    for out in n.output]
      self.assertEqual(transposed, [[20, 5]], msg=mode)   # [4H, H]
      folded = [n.node_name for n in nodes
                if "FoldTransposeIntoMatMul" in n.node_name and
                "Tensordot" not in n.node_name]
      self.assertEqual(folded, [], msg=mode)

  def testKernelSplitIsAViewOfTheKernel(self):
    """The input and recurrent rows of medium's kernel are not copied.

    Its rows (2,600 floats, 10,400 bytes) are not a multiple of 64 bytes,
    so a split along dim 0 copied the kernel (tf.split checks the row size),
    although both halves start on a 64-byte boundary. Buffer addresses are
    read through DLPack: numpy() would copy.
    """
    kernel = tf.reshape(tf.range(1300 * 2600, dtype=tf.float32), [1300, 2600])
    w_x, w_h = ptb_word_lm._split_kernel(kernel, 650)
    self.assertAllEqual(w_x, kernel[:650])
    self.assertAllEqual(w_h, kernel[650:])
    base = buffer_address(kernel)
    self.assertEqual([buffer_address(w_x) - base, buffer_address(w_h) - base],
                     [0, 650 * 2600 * 4])
    # The check itself can fail: tf.split of the 2-D kernel copies.
    copied = tf.split(kernel, [650, 650])[1]
    self.assertNotEqual(buffer_address(copied) - base, 650 * 2600 * 4)


class LstmStackTest(tf.test.TestCase):
  """The BASIC wavefront over all layers equals the layers one by one."""

  def _run(self, rnn_mode, chunk, values):
    x, states, kernels, biases, masks, dy, d_states = values
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      x = tf.constant(x)
      states = [util.LSTMStateTuple(tf.constant(c), tf.constant(h))
                for c, h in states]
      kernels = [tf.constant(k) for k in kernels]
      biases = [tf.constant(b) for b in biases]
      outputs, finals = ptb_word_lm.lstm_stack(
          rnn_mode, x, states, kernels, biases,
          [tf.constant(m) for m in masks], chunk=chunk)
      loss = tf.reduce_sum(outputs * dy)
      for (dc, dh), s in zip(d_states, finals):
        loss += tf.reduce_sum(s.c * dc) + tf.reduce_sum(s.h * dh)
      wrt = ([x] + [s.c for s in states] + [s.h for s in states] + kernels +
             biases)
      return sess.run([outputs] + [list(s) for s in finals] +
                      tf.compat.v1.gradients(loss, wrt))

  def testWavefrontEqualsLayerByLayerWithDropoutMasks(self):
    rng = np.random.RandomState(7)
    steps, batch, size, layers = 5, 3, 4, 3
    u = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32)
    masks = [(rng.uniform(size=(steps, batch, size)) > 0.4).astype(np.float32)
             / 0.6 for _ in range(layers - 1)]
    values = (u(steps, batch, size),
              [(u(batch, size), u(batch, size)) for _ in range(layers)],
              [u(2 * size, 4 * size) for _ in range(layers)],
              [u(4 * size) for _ in range(layers)], masks,
              u(steps, batch, size),
              [(u(batch, size), u(batch, size)) for _ in range(layers)])
    want = self._run(ptb_word_lm.BLOCK, None, values)
    # Chunks of 2 steps leave a last chunk of 1; None is one chunk.
    for chunk in (2, None, 1):
      got = self._run(ptb_word_lm.BASIC, chunk, values)
      self.assertEqual(len(got), len(want))
      for k, (g, w) in enumerate(zip(got, want)):
        self.assertAllClose(g, w, rtol=1e-5, atol=1e-6,
                            msg="chunk %s, result %d" % (chunk, k))


class SoftmaxLossTest(tf.test.TestCase):

  def _check(self, inputs, w, b, labels, d_loss):
    """Both paths of softmax_loss against TensorFlow's; their losses."""
    paths = [ptb_word_lm._softmax_loss_ops]
    # The kernel's path where it can run (lstm_kernels_test compares the
    # two paths directly too).
    if lstm_kernels.load() is not None:
      paths.append(ptb_word_lm._softmax_loss_fused)
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


def build_tiny_model(config, rows, rnn_mode, devices=("/cpu:0",),
                     is_training=True, seed=0):
  """A model on fixed random data `rows` `[batch, steps + 1]` ids."""
  config.rnn_mode = rnn_mode
  data = rows.reshape(-1)  # rows are contiguous streams: see reader.
  input_ = ptb_word_lm.PTBInput(config, data, name="Input",
                                num_towers=len(devices))
  initializer = tf.compat.v1.random_uniform_initializer(
      -config.init_scale, config.init_scale, seed=seed)
  with tf.compat.v1.variable_scope("Model", initializer=initializer,
                                   reuse=tf.compat.v1.AUTO_REUSE):
    return ptb_word_lm.PTBModel(is_training, config, input_, devices=devices)


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


def unigram_perplexity(train, test):
  """Perplexity on `test` of the word frequencies of `train` (id lists)."""
  counts = np.bincount(train, minlength=max(max(train), max(test)) + 1)
  return float(np.exp(-np.mean(np.log(counts[test[1:]] / len(train)))))


def train_in_process(config, data, eval_unroll=20, seed=1):
  """Trains `config` as main does, in this process.

  Returns:
    (graph, session, models) with the trained weights; the caller closes
    the session.
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
    train = models["train"]
    for i in range(config.max_max_epoch):
      train.assign_lr(session, ptb_word_lm.epoch_learning_rate(config, i))
      ptb_word_lm.run_epoch(session, train, eval_op=train.train_op)
  return graph, session, models


def learning_config():
  """--model=test with LEARNING_OVERRIDES, in BASIC."""
  config = ptb_word_lm.get_config("test", "basic")
  ptb_word_lm.apply_overrides(config, LEARNING_OVERRIDES)
  return config


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
      model = models["test"]
      carried = ptb_word_lm.run_epoch(session, model)
      lost = ptb_word_lm.run_epoch(
          session, model, on_step=lambda *_: session.run(model.reset_state))
    # Measured: unigram 11.0, state carried 2.2-2.3, state lost 170-224:
    # without it the model predicts confidently from the wrong words.
    self.assertGreater(unigram, 9.0)
    self.assertGreater(lost, 9.0)
    self.assertLess(carried, LEARNED_TEST_PERPLEXITY)


def reference_cost(weights, rows, masks=None):
  """The model's cost in numpy from zero state: SPEC cell, dropout masks.

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
    for mode in (ptb_word_lm.BASIC, ptb_word_lm.BLOCK):
      config = self._config(0.5)
      rows = self._rows(config)
      with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(7)
        model = build_tiny_model(config, rows, mode)
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
      # The cost is that of the SPEC's model with these masks applied.
      self.assertAllClose(cost, reference_cost(weights, rows, drawn),
                          rtol=1e-5, msg=mode)
      self.assertNotAllClose(cost, reference_cost(weights, rows), rtol=1e-3)

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


# Lines of the SPEC's output formats.
LINE_FORMATS = [
    r"Epoch: \d+ Learning rate: \d+\.\d{3}",
    r"\d+\.\d{3} perplexity: \d+\.\d{3} speed: \d+ wps",
    r"Epoch: \d+ Train Perplexity: \d+\.\d{3}",
    r"Epoch: \d+ Valid Perplexity: \d+\.\d{3}",
    r"Test Perplexity: \d+\.\d{3}",
    r"Peak RSS: \d+ MiB",
    r"Saving model to .+\.",
]


class CommandLineTest(tf.test.TestCase):

  def testTestModelOnGeneratedCorpusPrintsSpecLines(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = os.path.join(tmp, "data")
      os.mkdir(data)
      make_corpus(data)
      save = os.path.join(tmp, "save")
      code, out, err = run_script("--data_path=" + data, "--model=test",
                                  "--num_gpus=0", "--save_path=" + save)
      self.assertEqual(code, 0, err)
      lines = out.splitlines()
      for line in lines:
        self.assertTrue(any(re.fullmatch(f, line) for f in LINE_FORMATS),
                        "line does not match the SPEC formats: %r" % line)
      progress = [l for l in lines if "wps" in l]
      self.assertBetween(len(progress), 8, 12)
      self.assertEqual(lines[0], "Epoch: 1 Learning rate: 1.000")
      self.assertRegex(lines[-3], r"Test Perplexity: ")
      self.assertRegex(lines[-2], r"Peak RSS: ")
      self.assertEqual(lines[-1], "Saving model to %s." % save)
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
      code, out2, err = run_script("--data_path=" + data, "--model=test",
                                   "--num_gpus=0", "--save_path=" + save)
      self.assertEqual(code, 0, err)
      self.assertIn("Resuming from epoch 2 step 0 of %s" % save, out2)
      self.assertNotIn("wps", out2)
      test = re.findall(r"Test Perplexity: \S+", out)
      self.assertEqual(re.findall(r"Test Perplexity: \S+", out2), test)

  def testTestModelOnRealPtbEndsWithFiniteTestPerplexity(self):
    code, out, err = run_script("--data_path=" + PTB_PATH, "--model=test",
                                "--num_gpus=0")
    self.assertEqual(code, 0, err)
    last = out.splitlines()[-2]
    match = re.fullmatch(r"Test Perplexity: (\d+\.\d{3})", last)
    self.assertIsNotNone(match, last)
    self.assertTrue(np.isfinite(float(match.group(1))))
    self.assertLess(float(match.group(1)), 10000)

  def testFp16LearnsInBothCpuModes(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_structured_corpus(tmp)
      for mode in ("BASIC", "BLOCK"):
        code, out, err = run_script("--data_path=" + tmp, "--model=test",
                                    "--num_gpus=0", "--use_fp16", "--seed=1",
                                    "--rnn_mode=" + mode,
                                    "--config_overrides=" + LEARNING_OVERRIDES)
        self.assertEqual(code, 0, err)
        test = float(re.search(r"Test Perplexity: (\S+)", out).group(1))
        self.assertLess(test, LEARNED_TEST_PERPLEXITY, mode)

  def testShortEpochsPrintProgressWithoutDividingByZero(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp, train_lines=12)
      # 12 short lines at batch 20 and 2 steps: a handful of steps per epoch.
      code, out, err = run_script("--data_path=" + tmp, "--model=test",
                                  "--num_gpus=0")
      self.assertEqual(code, 0, err)
      progress = [l for l in out.splitlines() if "wps" in l]
      self.assertNotEmpty(progress)
      self.assertIn("Test Perplexity", out)


def assert_user_error(test, args, pattern, code=1):
  """Runs the script; checks exit `code`, one error line, no traceback.

  Returns:
    (stdout, stderr) for further checks.
  """
  exit_code, out, err = run_script(*args)
  test.assertEqual(exit_code, code, "stdout: %s\nstderr: %s" % (out, err))
  test.assertNotIn("Traceback", err)
  error_lines = [l for l in err.splitlines()
                 if l.startswith("ptb_word_lm.py: error:")]
  test.assertLen(error_lines, 1, err)
  test.assertRegex(error_lines[0], pattern)
  return out, err


class LibraryPagesTest(tf.test.TestCase):

  def testReleasedAfterStartupAndAfterEachGraphsFirstCall(self):
    # Two epochs: the training and validation graphs run twice, yet their
    # first calls are what ran code only once.
    config = TinyConfig()
    config.max_max_epoch = 2
    eval_config = TinyConfig()
    eval_config.batch_size = eval_config.num_steps = 1
    rng = np.random.RandomState(3)
    data = [list(rng.randint(0, config.vocab_size, size=n))
            for n in (400, 60, 30)]
    calls = []

    def release():
      calls.append(dict(run.where))
      return 0.0

    run = None
    with mock.patch.object(monitor, "release_library_pages", release):
      run = ptb_word_lm.TrainingRun(
          config, eval_config, data, ["/cpu:0"],
          {"save_path": None, "use_fp16": False, "intra_op_threads": 0,
           "inter_op_threads": 0, "eval_unroll": 4, "seed": 1,
           "save_every_steps": 0, "summary_json": None, "start_time": 0.0,
           "cluster": None, "cluster_timeout": 60.0, "summary": {},
           "sampler": None})
      run.run()
    self.assertEqual([(c["phase"], c["epoch"], c["step"]) for c in calls],
                     [("startup", 0, 0), ("train", 1, 0), ("valid", 1, 0),
                      ("test", 2, 0)])


class LearningRateScheduleTest(tf.test.TestCase):

  def testEachEpochsUpdateUsesTheScheduledRate(self):
    # One training step an epoch, always clipped: the weights then move by
    # exactly rate x max_grad_norm (global norm), whatever the gradient.
    config = TinyConfig()
    config.max_epoch, config.max_max_epoch, config.lr_decay = 2, 5, 0.5
    config.max_grad_norm = 0.01
    eval_config = copy.copy(config)
    eval_config.batch_size = eval_config.num_steps = 1
    rng = np.random.RandomState(3)
    data = [list(rng.randint(0, config.vocab_size, size=n))
            for n in (30, 30, 20)]
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

    with mock.patch.object(ptb_word_lm, "run_epoch", run_epoch):
      ptb_word_lm.train(
          config, eval_config, data, ["/cpu:0"],
          {"save_path": None, "use_fp16": False, "intra_op_threads": 0,
           "inter_op_threads": 0, "eval_unroll": 4, "seed": 1,
           "save_every_steps": 0, "summary_json": None, "start_time": 0.0,
           "cluster": None, "cluster_timeout": 60.0, "summary": {},
           "sampler": None})
    self.assertAllClose(np.array(moved) / config.max_grad_norm,
                        [1.0, 1.0, 0.5, 0.25, 0.125], rtol=1e-3)


class StartupTest(tf.test.TestCase):

  def testEntryPointsKeepKerasOut(self):
    # -X importtime lists on stderr every module the process imports.
    for script in ("ptb_word_lm.py", "benchmark.py"):
      proc = subprocess.run(
          [sys.executable, "-X", "importtime", script, "--helpshort"],
          capture_output=True, text=True, timeout=600, cwd=HERE)
      self.assertIn("--data_path", proc.stdout, msg=proc.stderr[-2000:])
      imported = [line.rsplit("|", 1)[-1].strip()
                  for line in proc.stderr.splitlines()
                  if line.startswith("import time:")]
      self.assertIn("tensorflow", imported, msg=script)
      self.assertEqual(
          [m for m in imported if m.split(".")[0] == "keras"], [], msg=script)


class ErrorTest(tf.test.TestCase):
  """Every user error: one line on stderr, non-zero exit, no traceback."""

  def assertUserError(self, args, pattern, code=1):
    assert_user_error(self, args, pattern, code)

  def testNoDataPath(self):
    self.assertUserError(["--num_gpus=0"], "--data_path", code=2)

  def testMissingFile(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp)
      os.remove(os.path.join(tmp, "ptb.test.txt"))
      self.assertUserError(["--data_path=" + tmp, "--num_gpus=0"],
                           "ptb.test.txt is missing.*simple-examples")

  def testEmptyFile(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp)
      open(os.path.join(tmp, "ptb.valid.txt"), "w").close()
      self.assertUserError(["--data_path=" + tmp, "--num_gpus=0"],
                           "ptb.valid.txt is empty")

  def testNotUtf8(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp)
      with open(os.path.join(tmp, "ptb.train.txt"), "ab") as f:
        f.write(b"caf\xe9\n")
      self.assertUserError(["--data_path=" + tmp, "--num_gpus=0"],
                           r"ptb.train.txt is not UTF-8 text: invalid byte "
                           r"0xe9 at byte offset \d+")

  def testUnknownModel(self):
    self.assertUserError(["--data_path=/x", "--model=huge", "--num_gpus=0"],
                         "huge.*small, medium, large, test", code=2)

  def testUnknownRnnMode(self):
    self.assertUserError(["--data_path=/x", "--rnn_mode=fancy",
                          "--num_gpus=0"], "fancy.*BASIC, BLOCK, CUDNN",
                         code=2)

  def testDefaultNumGpusWithoutGpu(self):
    if tf.config.list_physical_devices("GPU"):
      self.skipTest("this machine has a GPU")
    self.assertUserError(["--data_path=" + PTB_PATH], "--num_gpus=0")

  def testCudnnWithoutGpu(self):
    if tf.config.list_physical_devices("GPU"):
      self.skipTest("this machine has a GPU")
    self.assertUserError(["--data_path=" + PTB_PATH, "--rnn_mode=cudnn",
                          "--num_gpus=0"], "CUDNN needs a GPU")

  def testVocabularyLargerThanConfig(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp, num_words=30)
      self.assertUserError(["--data_path=" + tmp, "--num_gpus=0",
                            "--config_overrides=vocab_size=20"],
                           "31 distinct words.*vocab_size is 20")

  def testEpochSizeZero(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp, train_lines=2)
      self.assertUserError(["--data_path=" + tmp, "--num_gpus=0"],
                           "epoch_size == 0, decrease batch_size or num_steps")

  def testBadOverrides(self):
    self.assertUserError(["--data_path=/x", "--num_gpus=0",
                          "--config_overrides=max_epochs=1"],
                         "unknown field 'max_epochs'.*max_epoch", code=2)
    self.assertUserError(["--data_path=/x", "--num_gpus=0",
                          "--config_overrides=num_layers=two"],
                         "num_layers=two is not a valid int", code=2)
    self.assertUserError(["--data_path=/x", "--num_gpus=0",
                          "--config_overrides=keep_prob=0"],
                         "keep_prob=0.0 must be in", code=2)


class ConfigTest(tf.test.TestCase):

  def testGetConfigIsFreshAndTakesRnnMode(self):
    a = ptb_word_lm.get_config("small")
    a.hidden_size = 3
    b = ptb_word_lm.get_config("small", "BaSiC")
    self.assertEqual(b.hidden_size, 200)
    self.assertEqual(b.rnn_mode, ptb_word_lm.BASIC)

  def testOverridesPrintAndApply(self):
    config = ptb_word_lm.get_config("large")
    changed = ptb_word_lm.apply_overrides(
        config, "max_epoch=1, max_max_epoch=2,keep_prob=0.5,rnn_mode=basic")
    self.assertEqual(changed, {"max_epoch": 1, "max_max_epoch": 2,
                               "keep_prob": 0.5, "rnn_mode": "basic"})
    self.assertEqual((config.max_epoch, config.max_max_epoch), (1, 2))
    self.assertIsInstance(config.max_epoch, int)

  def testSpecValues(self):
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
      self.assertEqual((config.learning_rate, config.batch_size,
                        config.vocab_size, config.rnn_mode),
                       (1.0, 20, 10000, ptb_word_lm.BLOCK))


if __name__ == "__main__":
  tf.test.main()
