"""Example / benchmark for building a PTB LSTM model.

Trains the model described in:
(Zaremba, et. al.) Recurrent Neural Network Regularization
http://arxiv.org/abs/1409.2329

There are 4 model configurations:
===========================================
| config | epochs | train | valid  | test
===========================================
| small  | 13     | 37.99 | 121.39 | 115.91
| medium | 39     | 48.45 |  86.16 |  82.07
| large  | 55     | 37.87 |  82.62 |  78.29
The exact results may vary depending on the random initialization.

The hyperparameters used in the model:
- init_scale - the initial scale of the weights
- learning_rate - the initial value of the learning rate
- max_grad_norm - the maximum permissible norm of the gradient
- num_layers - the number of LSTM layers
- num_steps - the number of unrolled steps of LSTM
- hidden_size - the number of LSTM units
- max_epoch - the number of epochs trained with the initial learning rate
- max_max_epoch - the total number of epochs for training
- keep_prob - the probability of keeping weights in the dropout layer
- lr_decay - the decay of the learning rate for each epoch after "max_epoch"
- batch_size - the batch size
- rnn_mode - the low level implementation of lstm cell: one of BASIC, BLOCK
  or CUDNN

To run:

$ python ptb_word_lm.py --data_path=simple-examples/data/ --num_gpus=0

This port runs on current TensorFlow (graph mode through tf.compat.v1) with
only tensorflow, numpy and absl-py.
"""

import os
import sys
import time

# Keep TensorFlow's C++ start-up chatter out of the benchmark's output; a
# user who wants it sets TF_CPP_MIN_LOG_LEVEL themselves.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf

import reader
import util

flags.DEFINE_string(
    "model", "small",
    "A type of model. Possible options are: small, medium, large, test.")
flags.DEFINE_string("data_path", None,
                    "Where the training/test data is stored.")
flags.DEFINE_string("save_path", None,
                    "Model output directory.")
flags.DEFINE_bool("use_fp16", False,
                  "Train using 16-bit floats instead of 32bit floats")
flags.DEFINE_integer("num_gpus", 1,
                     "If larger than 1, Grappler AutoParallel optimizer "
                     "will create multiple training replicas with each GPU "
                     "running one replica.")
flags.DEFINE_string("rnn_mode", None,
                    "The low level implementation of lstm cell: one of CUDNN, "
                    "BASIC, and BLOCK, representing cudnn_lstm, basic_lstm, "
                    "and lstm_block_cell classes.")
flags.DEFINE_string(
    "config_overrides", None,
    "Comma-separated field=value pairs that change the chosen config for this "
    "run, e.g. max_epoch=1,max_max_epoch=2.")
flags.DEFINE_integer(
    "cpu_towers", 1,
    "With --num_gpus=0: train with this many towers on virtual CPU devices "
    "(tests the multi-tower path without GPUs; it is not faster).")
flags.DEFINE_integer("intra_op_threads", 0,
                     "Threads inside one op; 0 lets TensorFlow choose.")
flags.DEFINE_integer("inter_op_threads", 0,
                     "Ops run in parallel; 0 lets TensorFlow choose.")
flags.DEFINE_integer(
    "eval_unroll", 200,
    "Validation and test run this many time steps per session call "
    "(an in-graph unroll); the perplexities are those of one window a call.")

flags.DEFINE_integer(
    "seed", None,
    "Graph-level random seed, for reproducible initialisation and dropout; "
    "unset, every run draws its own (as the original did).")

FLAGS = flags.FLAGS
BASIC = "basic"
CUDNN = "cudnn"
BLOCK = "block"
RNN_MODES = (BASIC, BLOCK, CUDNN)
CPU_RNN_MODE = BASIC


class UserError(Exception):
  """A problem the user can fix; printed as one line, no traceback."""

  def __init__(self, message, exit_code=1):
    super().__init__(message)
    self.exit_code = exit_code


def data_type(use_fp16):
  return tf.float16 if use_fp16 else tf.float32


class PTBInput(object):
  """The input data.

  Attributes:
    batch_size: rows per tower.
    num_towers: towers fed by this input; the producer delivers
      `num_towers * batch_size` rows.
    num_steps: steps per window.
    epoch_size: windows per epoch.
    steps_per_call: windows per session call (1 for training).
    num_calls: session calls per epoch.
    input_data, targets: int32 `[num_towers * batch_size,
      steps_per_call * num_steps]`.
    weights: float32 like targets (0 on padding), or None when
      steps_per_call == 1.
  """

  def __init__(self, config, data, name=None, num_towers=1, steps_per_call=1):
    self.batch_size = batch_size = config.batch_size
    self.num_towers = num_towers
    self.num_steps = num_steps = config.num_steps
    rows = batch_size * num_towers
    self.epoch_size = reader.check_epoch_size(len(data), rows, num_steps, name)
    self.steps_per_call = steps_per_call = min(steps_per_call, self.epoch_size)
    self.num_calls = -(-self.epoch_size // steps_per_call)
    if steps_per_call == 1:
      self.input_data, self.targets = reader.ptb_producer(
          data, rows, num_steps, name=name)
      self.weights = None
    else:
      self.input_data, self.targets, self.weights = reader.ptb_chunk_producer(
          data, rows, num_steps, steps_per_call, name=name)

  def steps_in_call(self, call):
    """Real (unpadded) windows in session call number `call`."""
    return min(self.steps_per_call, self.epoch_size - call * self.steps_per_call)


# ---------------------------------------------------------------------------
# LSTM layers. All modes take time-major inputs `[T, B, I]`, an initial state
# `(c, h)` of `[B, H]` each, and the canonical weights: kernel
# `[I + H, 4H]` with gate blocks (input, candidate, forget, output) and bias
# `[4H]`. They return outputs `[T, B, H]` and the final `(c, h)`.
# ---------------------------------------------------------------------------


def _lstm_basic_forward(x, c, h, kernel, bias):
  """Forward pass from core ops, keeping what the backward pass needs."""
  num_steps, input_size = x.shape[0], x.shape[2]
  w_x, w_h = kernel[:input_size], kernel[input_size:]
  # One large matmul for the input projection of every step; only the
  # recurrent product h @ w_h has to wait for the previous step.
  x_proj = tf.tensordot(x, w_x, 1) + bias
  acts = {k: [] for k in ("i", "ci", "f", "o", "cs", "co", "h_prev", "c_prev")}
  outputs = []
  for t in range(num_steps):
    gates = x_proj[t] + tf.matmul(h, w_h)
    i, j, f, o = tf.split(gates, 4, axis=1)
    i, ci, f, o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f), tf.sigmoid(o)
    acts["c_prev"].append(c)
    acts["h_prev"].append(h)
    c = f * c + i * ci
    co = tf.tanh(c)
    h = o * co
    for k, v in (("i", i), ("ci", ci), ("f", f), ("o", o), ("cs", c),
                 ("co", co)):
      acts[k].append(v)
    outputs.append(h)
  return tf.stack(outputs), c, h, acts


@tf.custom_gradient
def _lstm_basic_layer(x, c0, h0, kernel, bias):
  """BASIC LSTM layer with a hand-written backward pass.

  The forward pass is the plain cell from matmul and elementwise ops. The
  backward pass runs the recurrence step by step with the fused elementwise
  gradient kernel (LSTMBlockCellGrad, which has the same gate layout) and
  one matmul per step for the recurrent input; every weight gradient is then
  ONE large matmul over all time steps instead of one small one per step.
  Tests check it against BLOCK's registered gradient and a numerical one.
  """
  outputs, c_last, h_last, acts = _lstm_basic_forward(x, c0, h0, kernel, bias)

  def grad(d_outputs, d_c, d_h):
    num_steps, input_size = x.shape[0], x.shape[2]
    hidden = h0.shape[1]
    w_h = kernel[input_size:]
    zeros_h = tf.zeros([hidden], kernel.dtype)
    d_c = tf.zeros_like(c_last) if d_c is None else d_c
    d_h = tf.zeros_like(h_last) if d_h is None else d_h
    d_out = tf.unstack(d_outputs) if d_outputs is not None else None
    d_gates = [None] * num_steps
    for t in reversed(range(num_steps)):
      if d_out is not None:
        d_h = d_h + d_out[t]
      d_c, d_gates[t], _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
          x=x[t], cs_prev=acts["c_prev"][t], h_prev=acts["h_prev"][t],
          w=kernel, wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=bias,
          i=acts["i"][t], cs=acts["cs"][t], f=acts["f"][t], o=acts["o"][t],
          ci=acts["ci"][t], co=acts["co"][t], cs_grad=d_c, h_grad=d_h,
          use_peephole=False)
      d_h = tf.matmul(d_gates[t], w_h, transpose_b=True)
    d_gates = tf.stack(d_gates)                       # [T, B, 4H]
    xh = tf.concat([x, tf.stack(acts["h_prev"])], 2)  # [T, B, I + H]
    flat_g = tf.reshape(d_gates, [-1, 4 * hidden])
    d_kernel = tf.matmul(tf.reshape(xh, [-1, input_size + hidden]), flat_g,
                         transpose_a=True)
    d_bias = tf.reduce_sum(flat_g, 0)
    d_x = tf.tensordot(d_gates, kernel[:input_size], [[2], [1]])
    return d_x, d_c, d_h, d_kernel, d_bias

  return (outputs, c_last, h_last), grad


def _build_basic(x, state, kernel, bias):
  outputs, c, h = _lstm_basic_layer(x, state.c, state.h, kernel, bias)
  return outputs, util.LSTMStateTuple(c, h)


def _build_block(x, state, kernel, bias):
  hidden = state.h.shape[1]
  zeros_h = tf.zeros([hidden], kernel.dtype)
  # BlockLSTM (V1) has the canonical gate layout; its defaults (forget_bias
  # 1.0, cell_clip 3.0) differ from the model's, so both are passed. A
  # negative cell_clip turns clipping off.
  _, cs, _, _, _, _, h = tf.raw_ops.BlockLSTM(
      seq_len_max=tf.constant(x.shape[0], tf.int64), x=x, cs_prev=state.c,
      h_prev=state.h, w=kernel, wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=bias,
      forget_bias=0.0, cell_clip=-1.0, use_peephole=False)
  return h, util.LSTMStateTuple(cs[-1], h[-1])


def _cudnn_params(kernel, bias, input_size, hidden):
  """The opaque cuDNN parameter buffer for one layer's canonical weights.

  The buffer is computed from the canonical variables at every step, so one
  checkpoint serves all three modes. CudnnRNNCanonicalToParams has no
  registered gradient; it only copies slices into place, so its gradient is
  the inverse copy, CudnnRNNParamsToCanonical.
  """
  attrs = dict(num_layers=1, num_units=hidden, input_size=input_size,
               rnn_mode="lstm", input_mode="linear_input",
               direction="unidirectional")
  weights, biases = util.canonical_to_cudnn(kernel, bias, input_size)

  @tf.custom_gradient
  def to_params(*canonical):
    params = tf.raw_ops.CudnnRNNCanonicalToParams(
        weights=canonical[:8], biases=canonical[8:], **attrs)

    def grad(d_params):
      d_w, d_b = tf.raw_ops.CudnnRNNParamsToCanonical(
          params=d_params, num_params=8, **attrs)
      return list(d_w) + list(d_b)

    return params, grad

  return to_params(*(weights + biases))


def _build_cudnn(x, state, kernel, bias):
  num_steps, batch, input_size = x.shape
  hidden = state.h.shape[1]
  # One cuDNN call per layer, so that dropout between layers is applied
  # outside it exactly as in the other modes.
  outputs, h, c, _, _ = tf.raw_ops.CudnnRNNV3(
      input=x, input_h=state.h[None], input_c=state.c[None],
      params=_cudnn_params(kernel, bias, input_size, hidden),
      sequence_lengths=tf.fill([batch], num_steps), rnn_mode="lstm",
      input_mode="linear_input", direction="unidirectional", dropout=0.0,
      is_training=True, time_major=True)
  return outputs, util.LSTMStateTuple(c[0], h[0])


_LAYER_BUILDERS = {BASIC: _build_basic, BLOCK: _build_block, CUDNN: _build_cudnn}


def lstm_layer(rnn_mode, x, state, kernel, bias):
  """Runs one LSTM layer in the given mode.

  Args:
    rnn_mode: BASIC, BLOCK or CUDNN.
    x: `[num_steps, batch, input]` time-major inputs.
    state: LSTMStateTuple of `[batch, hidden]` tensors.
    kernel: `[input + hidden, 4 * hidden]`, gate blocks (i, j, f, o).
    bias: `[4 * hidden]`.

  Returns:
    (outputs `[num_steps, batch, hidden]`, final LSTMStateTuple).
  """
  return _LAYER_BUILDERS[rnn_mode](x, state, kernel, bias)


@tf.custom_gradient
def sparse_softmax_cross_entropy(logits, labels):
  """Per-row cross-entropy of `[N, V]` float32 logits against `[N]` labels.

  Equal to tf.nn.sparse_softmax_cross_entropy_with_logits, about three times
  faster on the CPU: the forward pass keeps the shifted exponentials, so the
  backward pass is one scale and one scatter instead of a second softmax.
  """
  shifted = logits - tf.reduce_max(logits, axis=1, keepdims=True)
  exp = tf.exp(shifted)
  total = tf.reduce_sum(exp, axis=1)
  index = tf.stack([tf.range(tf.shape(labels)[0]), labels], axis=1)
  loss = tf.math.log(total) - tf.gather_nd(shifted, index)

  def grad(d_loss):
    scale = d_loss / total
    d_logits = tf.tensor_scatter_nd_sub(exp * scale[:, None], index, d_loss)
    return d_logits, None

  return loss, grad


class PTBModel(object):
  """The PTB model.

  The graph keeps each tower's LSTM state in a local variable, so a step
  needs no feed: `update_state` stores the final state that the next call's
  `initial_state` reads, and `reset_state` zeroes it at the start of a pass.
  """

  def __init__(self, is_training, config, input_, devices=("/cpu:0",),
               use_fp16=False):
    self._is_training = is_training
    self._input = input_
    self._rnn_mode = config.rnn_mode
    self._num_layers = config.num_layers
    self._num_towers = len(devices)
    dtype = data_type(use_fp16)

    with tf.device(util.variable_device(devices)):
      params = self._create_variables(config, dtype)
      if is_training:
        self._lr = tf.compat.v1.Variable(0.0, trainable=False,
                                         name="learning_rate")
        self._new_lr = tf.compat.v1.placeholder(
            tf.float32, shape=[], name="new_learning_rate")
        self._lr_update = tf.compat.v1.assign(self._lr, self._new_lr)

    tower_inputs = zip(
        util.split_rows(input_.input_data, self._num_towers),
        util.split_rows(input_.targets, self._num_towers),
        (util.split_rows(input_.weights, self._num_towers)
         if input_.weights is not None else [None] * self._num_towers))
    costs, tower_grads, self._states = [], [], []
    for k, (device, (x, y, w)) in enumerate(zip(devices, tower_inputs)):
      with tf.device(device), tf.name_scope("tower_%d" % k):
        cost, state = self._build_tower(x, y, w, params, config, dtype)
        costs.append(cost)
        self._states.append(state)
        if is_training:
          tower_grads.append(tf.compat.v1.gradients(
              cost, params, colocate_gradients_with_ops=True))
    # The towers' average cost is the cost of one tower with all their rows.
    self._cost = costs[0] if len(costs) == 1 else tf.add_n(costs) / len(costs)

    done = [self._cost]
    if is_training:
      with tf.device(util.variable_device(devices)):
        grads = util.average_gradients(tower_grads)
        grads, _ = tf.clip_by_global_norm(grads, config.max_grad_norm)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(self._lr)
        self._train_op = optimizer.apply_gradients(
            zip(grads, params),
            global_step=tf.compat.v1.train.get_or_create_global_step())
      done = [self._train_op]
    # The state is stored only after the step has used the old one.
    with tf.control_dependencies(done):
      self._update_state = tf.group(
          *[s["var"].assign(util.pack_state(s["final"])) for s in self._states])
    self._reset_state = tf.group(
        *[s["var"].initializer for s in self._states])

  def _create_variables(self, config, dtype):
    """Creates the shared weights; returns them in a fixed order."""
    size, vocab = config.hidden_size, config.vocab_size
    params = [tf.compat.v1.get_variable("embedding", [vocab, size], dtype)]
    for layer in range(config.num_layers):
      with tf.compat.v1.variable_scope("RNN/cell_%d" % layer):
        params.append(tf.compat.v1.get_variable(
            "kernel", [2 * size, 4 * size], dtype))
        params.append(tf.compat.v1.get_variable("bias", [4 * size], dtype))
    params.append(tf.compat.v1.get_variable("softmax_w", [size, vocab], dtype))
    params.append(tf.compat.v1.get_variable("softmax_b", [vocab], dtype))
    return params

  def _build_tower(self, input_data, targets, weights, params, config, dtype):
    """Builds one tower's forward pass and cost.

    Args:
      input_data, targets: int32 `[batch, steps]`.
      weights: float32 `[batch, steps]` or None (all ones).

    Returns:
      (cost, state) where cost is the sum over time of the batch-averaged
      cross-entropy and state a dict with the state variable, the initial
      and the final state.
    """
    embedding, softmax_w, softmax_b = params[0], params[-2], params[-1]
    batch_size = input_data.shape[0]
    size, num_layers = config.hidden_size, config.num_layers
    keep_prob = config.keep_prob if self._is_training else 1.0

    state_var = tf.compat.v1.Variable(
        tf.zeros([num_layers, 2, batch_size, size], dtype), trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], name="lstm_state")
    initial_state = util.unpack_state(state_var.read_value(), num_layers)

    # Time-major from here on: [steps, batch, ...].
    inputs = tf.nn.embedding_lookup(embedding, tf.transpose(input_data))
    if keep_prob < 1:
      inputs = tf.nn.dropout(inputs, rate=1 - keep_prob)
    final_state = []
    for layer in range(num_layers):
      kernel, bias = params[1 + 2 * layer], params[2 + 2 * layer]
      inputs, layer_state = lstm_layer(self._rnn_mode, inputs,
                                       initial_state[layer], kernel, bias)
      if keep_prob < 1:
        inputs = tf.nn.dropout(inputs, rate=1 - keep_prob)
      final_state.append(layer_state)

    output = tf.reshape(inputs, [-1, size])
    logits = tf.matmul(output, softmax_w) + softmax_b
    # The loss is computed in float32 even with --use_fp16: exp of fp16
    # logits over a 10k vocabulary loses most of the precision that matters.
    loss = sparse_softmax_cross_entropy(
        tf.cast(logits, tf.float32), tf.reshape(tf.transpose(targets), [-1]))
    if weights is not None:
      loss *= tf.reshape(tf.transpose(weights), [-1])
    cost = tf.reduce_sum(loss) / tf.cast(batch_size, tf.float32)
    return cost, {"var": state_var, "initial": initial_state,
                  "final": tuple(final_state)}

  def assign_lr(self, session, lr_value):
    session.run(self._lr_update, feed_dict={self._new_lr: lr_value})

  @property
  def input(self):
    return self._input

  @property
  def initial_state(self):
    """The first tower's initial state: a tuple of LSTMStateTuple."""
    return self._states[0]["initial"]

  @property
  def final_state(self):
    """The first tower's final state: a tuple of LSTMStateTuple."""
    return self._states[0]["final"]

  @property
  def cost(self):
    return self._cost

  @property
  def lr(self):
    return self._lr

  @property
  def train_op(self):
    return self._train_op

  @property
  def update_state(self):
    return self._update_state

  @property
  def reset_state(self):
    return self._reset_state

  @property
  def num_towers(self):
    return self._num_towers


class SmallConfig(object):
  """Small config."""
  init_scale = 0.1
  learning_rate = 1.0
  max_grad_norm = 5
  num_layers = 2
  num_steps = 20
  hidden_size = 200
  max_epoch = 4
  max_max_epoch = 13
  keep_prob = 1.0
  lr_decay = 0.5
  batch_size = 20
  vocab_size = 10000
  rnn_mode = BLOCK


class MediumConfig(object):
  """Medium config."""
  init_scale = 0.05
  learning_rate = 1.0
  max_grad_norm = 5
  num_layers = 2
  num_steps = 35
  hidden_size = 650
  max_epoch = 6
  max_max_epoch = 39
  keep_prob = 0.5
  lr_decay = 0.8
  batch_size = 20
  vocab_size = 10000
  rnn_mode = BLOCK


class LargeConfig(object):
  """Large config."""
  init_scale = 0.04
  learning_rate = 1.0
  max_grad_norm = 10
  num_layers = 2
  num_steps = 35
  hidden_size = 1500
  max_epoch = 14
  max_max_epoch = 55
  keep_prob = 0.35
  lr_decay = 1 / 1.15
  batch_size = 20
  vocab_size = 10000
  rnn_mode = BLOCK


class TestConfig(object):
  """Tiny config, for testing."""
  init_scale = 0.1
  learning_rate = 1.0
  max_grad_norm = 1
  num_layers = 1
  num_steps = 2
  hidden_size = 2
  max_epoch = 1
  max_max_epoch = 1
  keep_prob = 1.0
  lr_decay = 0.5
  batch_size = 20
  vocab_size = 10000
  rnn_mode = BLOCK


CONFIGS = {"small": SmallConfig, "medium": MediumConfig, "large": LargeConfig,
           "test": TestConfig}


def run_epoch(session, model, eval_op=None, verbose=False):
  """Runs the model over one pass of its input.

  Args:
    session: a tf.compat.v1.Session.
    model: a PTBModel.
    eval_op: an op to run with every step (the training op), or None.
    verbose: print the progress line about ten times.

  Returns:
    The perplexity of the pass.
  """
  start_time = time.time()
  costs = 0.0
  iters = 0
  session.run(model.reset_state)
  fetches = {"cost": model.cost, "state": model.update_state}
  if eval_op is not None:
    fetches["eval_op"] = eval_op
  data = model.input
  # The original printed when step % (epoch_size // 10) == 10, which divides
  # by zero below ten steps and prints nothing below 110; this keeps its
  # cadence on long epochs and still prints about ten lines on short ones.
  every = max(1, data.epoch_size // 10)
  words_per_window = data.batch_size * data.num_towers * data.num_steps
  for step in range(data.num_calls):
    vals = session.run(fetches)
    costs += vals["cost"]
    iters += data.num_steps * data.steps_in_call(step)
    if verbose and step % every == 10 % every:
      print("%.3f perplexity: %.3f speed: %.0f wps" %
            (step * 1.0 / data.epoch_size, np.exp(costs / iters),
             (step + 1) * words_per_window / (time.time() - start_time)),
            flush=True)
  return np.exp(costs / iters)


def get_config(model, rnn_mode=None):
  """Returns a fresh config instance for `model`, with `rnn_mode` if given."""
  if model not in CONFIGS:
    raise UserError("Invalid model: %s; valid values are %s"
                    % (model, ", ".join(CONFIGS)), exit_code=2)
  config = CONFIGS[model]()
  if rnn_mode:
    config.rnn_mode = parse_rnn_mode(rnn_mode)
  return config


def parse_rnn_mode(value):
  mode = value.lower()
  if mode not in RNN_MODES:
    raise UserError("Invalid --rnn_mode=%s; valid values are BASIC, BLOCK, "
                    "CUDNN (any case)" % value, exit_code=2)
  return mode


def config_fields(config):
  """The config's fields and values, in a stable order."""
  return {k: getattr(config, k) for k in sorted(dir(config))
          if not k.startswith("_") and not callable(getattr(config, k))}


def apply_overrides(config, overrides):
  """Applies "field=value,..." to `config`; returns the fields it set."""
  fields = config_fields(config)
  changed = {}
  for item in filter(None, (s.strip() for s in overrides.split(","))):
    name, sep, text = item.partition("=")
    name, text = name.strip(), text.strip()
    if not sep or name not in fields:
      raise UserError("--config_overrides: unknown field %r in %r; fields are "
                      "%s" % (name, item, ", ".join(fields)), exit_code=2)
    old = fields[name]
    try:
      if name == "rnn_mode":
        value = parse_rnn_mode(text)
      elif isinstance(old, int):
        value = int(text)
      else:
        value = float(text)
    except ValueError:
      raise UserError("--config_overrides: %s=%s is not a valid %s"
                      % (name, text, type(old).__name__), exit_code=2) from None
    setattr(config, name, value)
    changed[name] = value
  return changed


def validate_config(config):
  """Refuses values that cannot train, with the field named."""
  positive_ints = ("num_layers", "num_steps", "hidden_size", "max_epoch",
                   "max_max_epoch", "batch_size", "vocab_size")
  for name in positive_ints:
    value = getattr(config, name)
    if not isinstance(value, int) or value <= 0:
      raise UserError("config %s=%r must be a positive integer"
                      % (name, value), exit_code=2)
  for name in ("init_scale", "learning_rate", "max_grad_norm", "lr_decay"):
    value = getattr(config, name)
    if not value > 0 or not np.isfinite(value):
      raise UserError("config %s=%r must be a positive number"
                      % (name, value), exit_code=2)
  if not 0 < config.keep_prob <= 1:
    raise UserError("config keep_prob=%r must be in (0, 1]" % config.keep_prob,
                    exit_code=2)


def check_devices(num_gpus, rnn_mode, cpu_towers):
  """Checks the device flags against the machine; returns tower devices."""
  if num_gpus < 0:
    raise UserError("--num_gpus=%d must be 0 or more" % num_gpus, exit_code=2)
  if cpu_towers < 1:
    raise UserError("--cpu_towers=%d must be 1 or more" % cpu_towers,
                    exit_code=2)
  # Probing for GPUs costs a CUDA initialisation (and its log lines), so the
  # CPU path does not ask.
  present = len(tf.config.list_physical_devices("GPU")) if num_gpus else 0
  if num_gpus > present:
    raise UserError(
        "--num_gpus=%d but this machine has %d GPU%s visible to TensorFlow; "
        "use --num_gpus=0 to train on the CPU"
        % (num_gpus, present, "" if present == 1 else "s"))
  if rnn_mode == CUDNN and num_gpus == 0:
    raise UserError("--rnn_mode=CUDNN needs a GPU (cuDNN) and --num_gpus >= 1; "
                    "on the CPU use BASIC or BLOCK")
  return util.tower_devices(num_gpus, cpu_towers)


def session_config(devices, intra_op_threads, inter_op_threads):
  cpu_count = sum(d.startswith("/cpu") for d in devices)
  return tf.compat.v1.ConfigProto(
      device_count={"CPU": max(1, cpu_count)},
      intra_op_parallelism_threads=intra_op_threads,
      inter_op_parallelism_threads=inter_op_threads,
      allow_soft_placement=False)


def build_models(config, eval_config, data, devices, use_fp16, eval_unroll):
  """Builds the Train, Valid and Test models, sharing one set of variables.

  Returns:
    A dict with the models under "train", "valid" and "test".
  """
  train_data, valid_data, test_data = data
  initializer = tf.compat.v1.random_uniform_initializer(
      -config.init_scale, config.init_scale)
  models = {}
  specs = (("train", "Train", True, config, train_data, devices),
           ("valid", "Valid", False, config, valid_data, devices[:1]),
           ("test", "Test", False, eval_config, test_data, devices[:1]))
  for key, name, is_training, cfg, ids, devs in specs:
    with tf.compat.v1.name_scope(name):
      steps_per_call = 1 if is_training else max(1, eval_unroll // cfg.num_steps)
      input_ = PTBInput(config=cfg, data=ids, name=name + "Input",
                        num_towers=len(devs), steps_per_call=steps_per_call)
      with tf.compat.v1.variable_scope("Model", reuse=bool(models),
                                       initializer=initializer):
        models[key] = PTBModel(is_training=is_training, config=cfg,
                               input_=input_, devices=devs, use_fp16=use_fp16)
  return models


def train(config, eval_config, data, devices, options):
  """Trains, validates and tests; prints the SPEC lines."""
  with tf.Graph().as_default():
    if options["seed"] is not None:
      tf.compat.v1.set_random_seed(options["seed"])
    models = build_models(config, eval_config, data, devices,
                          options["use_fp16"], options["eval_unroll"])
    m, mvalid, mtest = models["train"], models["valid"], models["test"]
    save_path = options["save_path"]
    saver = tf.compat.v1.train.Saver(tf.compat.v1.global_variables(),
                                     max_to_keep=2)
    writer = (tf.compat.v1.summary.FileWriter(save_path)
              if save_path else None)
    sess_config = session_config(devices, options["intra_op_threads"],
                                 options["inter_op_threads"])
    with tf.compat.v1.Session(config=sess_config) as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer()])
      ckpt = save_path and tf.train.latest_checkpoint(save_path)
      if ckpt:
        saver.restore(session, ckpt)
      global_step = tf.compat.v1.train.get_global_step()
      for i in range(config.max_max_epoch):
        lr_decay = config.lr_decay ** max(i + 1 - config.max_epoch, 0.0)
        m.assign_lr(session, config.learning_rate * lr_decay)

        print("Epoch: %d Learning rate: %.3f" % (i + 1, session.run(m.lr)))
        train_perplexity = run_epoch(session, m, eval_op=m.train_op,
                                     verbose=True)
        print("Epoch: %d Train Perplexity: %.3f" % (i + 1, train_perplexity))
        valid_perplexity = run_epoch(session, mvalid)
        print("Epoch: %d Valid Perplexity: %.3f" % (i + 1, valid_perplexity))
        if writer:
          step = session.run(global_step)
          _write_scalars(writer, step, {
              "Training Loss": np.log(train_perplexity) * config.num_steps,
              "Learning Rate": config.learning_rate * lr_decay,
              "Validation Loss": np.log(valid_perplexity) * config.num_steps})

      test_perplexity = run_epoch(session, mtest)
      print("Test Perplexity: %.3f" % test_perplexity)

      if save_path:
        print("Saving model to %s." % save_path)
        saver.save(session, os.path.join(save_path, "model.ckpt"),
                   global_step=global_step)
    if writer:
      writer.close()


def _write_scalars(writer, step, values):
  summary = tf.compat.v1.Summary(value=[
      tf.compat.v1.Summary.Value(tag=tag, simple_value=float(v))
      for tag, v in values.items()])
  writer.add_summary(summary, step)
  writer.flush()


def load_data(data_path, config):
  """Reads the corpus; checks it fits the config. Returns the three id lists."""
  try:
    train_data, valid_data, test_data, vocab_size = reader.ptb_raw_data(
        data_path)
  except reader.DataError as e:
    raise UserError(str(e)) from None
  if vocab_size > config.vocab_size:
    raise UserError(
        "the training corpus has %d distinct words but the config's "
        "vocab_size is %d: raise vocab_size (e.g. --config_overrides="
        "vocab_size=%d) or use a smaller corpus"
        % (vocab_size, config.vocab_size, vocab_size))
  return train_data, valid_data, test_data


def main(_):
  if not FLAGS.data_path:
    raise UserError("Must set --data_path to PTB data directory "
                    "(simple-examples/data)", exit_code=2)
  config = get_config(FLAGS.model, FLAGS.rnn_mode)
  if FLAGS.rnn_mode is None and FLAGS.num_gpus == 0:
    # On the CPU the hand-batched BASIC cell trains fastest (see README,
    # "Performance"); the configs keep BLOCK, the GPU default.
    config.rnn_mode = CPU_RNN_MODE
  if FLAGS.config_overrides:
    changed = apply_overrides(config, FLAGS.config_overrides)
    print("Config overrides: %s" % ", ".join(
        "%s=%s" % kv for kv in changed.items()))
  validate_config(config)
  devices = check_devices(FLAGS.num_gpus, config.rnn_mode, FLAGS.cpu_towers)
  eval_config = get_config(FLAGS.model)
  for name, value in config_fields(config).items():
    setattr(eval_config, name, value)
  eval_config.batch_size = 1
  eval_config.num_steps = 1

  data = load_data(FLAGS.data_path, config)
  options = {"save_path": FLAGS.save_path, "use_fp16": FLAGS.use_fp16,
             "intra_op_threads": FLAGS.intra_op_threads,
             "inter_op_threads": FLAGS.inter_op_threads,
             "eval_unroll": FLAGS.eval_unroll, "seed": FLAGS.seed}
  try:
    train(config, eval_config, data, devices, options)
  except reader.DataError as e:
    raise UserError(str(e)) from None


def run_main(argv=None):
  """Entry point: graph mode, and user errors as one line without traceback."""
  tf.compat.v1.disable_eager_execution()
  try:
    app.run(main, argv=argv)
  except UserError as e:
    print("%s: error: %s" % (os.path.basename(sys.argv[0]), e),
          file=sys.stderr)
    sys.exit(e.exit_code)


if __name__ == "__main__":
  run_main()
