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

import copy
import os
import platform
import signal
import sys
import time

# Keep TensorFlow's C++ chatter out of the benchmark's output (on a machine
# without a GPU every start logs a failed cuInit as an error); real failures
# still reach Python as exceptions. A user who wants the logs sets
# TF_CPP_MIN_LOG_LEVEL themselves.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import monitor  # pylint: disable=g-bad-import-order
if __name__ == "__main__":
  # Before TensorFlow is imported: no Keras, two malloc arenas.
  monitor.reduce_memory_footprint()

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf

import cluster as cluster_lib
import lstm_kernels
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
                     "GPUs to train on; 0 trains on the CPU. Above 1, one "
                     "tower per GPU, each on its own rows of the batch, with "
                     "the gradients averaged.")
flags.DEFINE_string("rnn_mode", None,
                    "The low level implementation of the LSTM: BASIC (core "
                    "ops), BLOCK (fused BlockLSTM) or CUDNN (cuDNN, GPUs "
                    "only); any case. Overrides the config; unset on the CPU "
                    "it is the fastest CPU mode (see README).")
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
    "eval_unroll", 20,
    "Validation and test run about this many time steps per session call "
    "(an in-graph unroll over consecutive windows); the perplexities are "
    "those of one window a call. Longer unrolls cost graph memory (about "
    "4.5 MiB a step for the small model) and gain little.")

flags.DEFINE_integer(
    "seed", None,
    "Graph-level random seed, for reproducible initialisation and dropout; "
    "unset, every run draws its own (as the original did).")

flags.DEFINE_integer(
    "save_every_steps", 0,
    "With --save_path, also save a checkpoint every this many training "
    "steps (0: only at the end of every epoch).")
flags.DEFINE_string(
    "memory_log", None,
    "Write a CSV of the process's RSS (and GPU memory) over time here, with "
    "the phase, epoch and step of the run.")
flags.DEFINE_float("memory_interval", 2.0,
                   "Seconds between two --memory_log samples.")
flags.DEFINE_string(
    "summary_json", None,
    "Write a JSON summary of the run here (rewritten after every epoch).")

flags.DEFINE_string("job_name", None,
                    "Multi-process training: this task's job, ps or worker.")
flags.DEFINE_integer("task_index", 0, "Index of this task within its job.")
flags.DEFINE_string("ps_hosts", None,
                    "Comma-separated host:port of the parameter servers.")
flags.DEFINE_string("worker_hosts", None,
                    "Comma-separated host:port of the workers (the first is "
                    "the chief).")
flags.DEFINE_float(
    "cluster_timeout", 300.0,
    "Seconds a task waits for the others (to start, to make progress) "
    "before it stops with an error instead of hanging.")

FLAGS = flags.FLAGS
BASIC = "basic"
CUDNN = "cudnn"
BLOCK = "block"
RNN_MODES = (BASIC, BLOCK, CUDNN)
CPU_RNN_MODE = BASIC


class Stop(Exception):
  """Ends the run with a one-line message and an exit code."""

  def __init__(self, message, exit_code):
    super().__init__(message)
    self.exit_code = exit_code


class UserError(Stop):
  """A problem the user can fix; printed as one error line, no traceback."""

  def __init__(self, message, exit_code=1):
    super().__init__(message, exit_code)


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
    position: int64 local variable, calls served so far (see
      reader.producer); a resumed run sets it.
  """

  def __init__(self, config, data, name=None, num_towers=1, steps_per_call=1,
               replica=(0, 1)):
    self.batch_size = batch_size = config.batch_size
    self.num_towers = num_towers
    self.num_steps = num_steps = config.num_steps
    # Worker `index` of `count` takes its own block of rows, as a tower does.
    index, count = replica
    rows = batch_size * num_towers
    self.epoch_size = reader.check_epoch_size(len(data), rows * count,
                                              num_steps, name)
    self.steps_per_call = steps_per_call = min(steps_per_call, self.epoch_size)
    producer = reader.producer(data, rows * count, num_steps, steps_per_call,
                               name=name)
    self.num_calls = producer.num_calls
    mine = slice(index * rows, (index + 1) * rows)
    self.input_data, self.targets = producer.x[mine], producer.y[mine]
    self.weights = None if producer.weights is None else producer.weights[mine]
    self.position = producer.position

  def steps_in_call(self, call):
    """Real (unpadded) windows in session call number `call`."""
    return min(self.steps_per_call, self.epoch_size - call * self.steps_per_call)


# ---------------------------------------------------------------------------
# LSTM layers. All modes take time-major inputs `[T, B, I]`, an initial state
# `(c, h)` of `[B, H]` each, and the canonical weights: kernel
# `[I + H, 4H]` with gate blocks (input, candidate, forget, output) and bias
# `[4H]`. They return outputs `[T, B, H]` and the final `(c, h)`.
# ---------------------------------------------------------------------------


def _blocks(x, chunk=None):
  """Time chunks of at most `chunk` steps (all if None) of `[T, ...]` x.

  A list of blocks `[C, ...]` is passed through: it is already chunked.
  """
  if isinstance(x, (list, tuple)):
    return list(x)
  num_steps = x.shape[0]
  chunk = chunk or num_steps
  if chunk >= num_steps:
    return [x]
  return [x[s:s + chunk] for s in range(0, num_steps, chunk)]


def _join(blocks):
  """The `[T, ...]` tensor of a list of time blocks."""
  return blocks[0] if len(blocks) == 1 else tf.concat(blocks, 0)


# The AVX-512 kernels (lstm_kernels.py) do the per-step recurrent products
# from this hidden size and batch on: in one process, training steps
# interleaved, median step time 12-18 % lower on medium (650) and large
# (1500), 2-5 % higher on small (200: its products fit in the L2 cache and
# oneDNN is as fast; the weight packing is then pure cost). With batch 1
# (the test pass: 20 words per session call) the packing, 7.6 and 9.5 ms
# per layer on large, would be repeated at every call, for 20 products of
# one row each.
_KERNEL_MIN_HIDDEN = 512
_KERNEL_MIN_BATCH = 8


def _cpu_kernels(like):
  """The kernels' op library (lstm_kernels.py), or None where they cannot run.

  Args:
    like: a tensor of the work, built on its tower's device. The kernels
      take float32 on the CPU only.
  """
  if like.dtype != tf.float32 or "GPU" in like.device.upper():
    return None
  return lstm_kernels.load()


def _recurrent_kernels(like, hidden):
  """The kernels' op library for a layer, or None to use tf.matmul.

  Args:
    like: a `[B, ...]` tensor of the layer, built on its tower's device.
    hidden: the layer's hidden size.
  """
  if hidden < _KERNEL_MIN_HIDDEN or (like.shape[0] or 0) < _KERNEL_MIN_BATCH:
    return None
  return _cpu_kernels(like)


def _forward_product(w_h, like):
  """The forward step's product: a function (h, x) -> h @ w_h + x.

  Args:
    w_h: `[H, 4H]` recurrent weights.
    like: a `[B, ...]` tensor of the layer, on its tower's device.

  Returns:
    A function of h `[B, H]` and x `[B, 4H]` returning `[B, 4H]`.
  """
  kernels = _recurrent_kernels(like, w_h.shape[0])
  if kernels is None:
    return lambda h, x: tf.matmul(h, w_h) + x
  panels = kernels.pack_panels(w_h, transpose=False)
  return lambda h, x: kernels.panel_mat_mul(h, panels, x)


def _backward_product(w_h, like):
  """The backward step's product: a function d_gates -> d_gates @ w_h^T.

  Args:
    w_h: `[H, 4H]` recurrent weights.
    like: a `[B, ...]` tensor of the layer, on its tower's device.

  Returns:
    A function of d_gates `[B, 4H]` returning `[B, H]`.
  """
  kernels = _recurrent_kernels(like, w_h.shape[0])
  if kernels is not None:
    panels = kernels.pack_panels(w_h, transpose=True)
    zeros = tf.zeros([like.shape[0], w_h.shape[0]], w_h.dtype)
    return lambda d_gates: kernels.panel_mat_mul(d_gates, panels, zeros)
  # w_h transposed once, so that the per-step product [B, 4H] x [4H, H]
  # needs no transpose_b: 2.47 instead of 2.79 ms on large, steps 4 %
  # faster on medium and large. Grappler folds a Transpose that feeds a
  # MatMul back into transpose_b=True; the Snapshot between them (which
  # forwards its input's buffer, no copy) keeps it. Only w_h: the input
  # half's product is one large matmul per chunk, as fast either way, and a
  # transposed copy of the whole kernel kept 2 x 69 MiB more alive during
  # the large model's step (peak RSS of its training 1,547 and 1,600
  # against 1,388 and 1,403 MiB).
  w_h_t = tf.raw_ops.Snapshot(input=tf.transpose(w_h))
  return lambda d_gates: tf.matmul(d_gates, w_h_t)


def _split_kernel(kernel, input_size):
  """The input rows `[I, 4H]` and the recurrent rows `[H, 4H]` of a kernel.

  Split as one flat vector: TensorFlow splits along dim 0 without copying
  when each piece starts on a 64-byte boundary, but for a 2-D tensor it
  checks that through the row size alone. Medium's rows (2,600 floats) are
  not a multiple of 16 floats, so each split copied the whole kernel (2.5
  ms, four times a step), although its pieces do start on a boundary; in
  1-D the pieces' own offsets are checked. (Pieces that do not start on
  one are copied, as before.)
  """
  rows, cols = kernel.shape
  w_x, w_h = tf.split(tf.reshape(kernel, [-1]),
                      [input_size * cols, (rows - input_size) * cols])
  return (tf.reshape(w_x, [input_size, cols]),
          tf.reshape(w_h, [rows - input_size, cols]))


def _lstm_basic_forward(x, c, h, kernel, bias):
  """Forward pass from core ops, keeping what the backward pass needs.

  Args:
    x: `[T, B, I]` inputs, or a list of time blocks `[C, B, I]`: the
      steps of a block wait only for that block's inputs.
    c, h: `[B, H]` initial state.
    kernel, bias: the canonical weights.

  Returns:
    (outputs: a list of T `[B, H]` tensors, per-step activations: a dict of
    lists of T `[B, H]` tensors under "i", "cs", "f", "o", "ci", "co" as
    BlockLSTM names them, and "c_prev", "h_prev").
  """
  blocks = _blocks(x)
  input_size = blocks[0].shape[2]
  w_x, w_h = _split_kernel(kernel, input_size)
  acts = {k: [] for k in ("i", "cs", "f", "o", "ci", "co", "c_prev",
                          "h_prev")}
  outputs = []
  product = _forward_product(w_h, h)
  for block in blocks:
    # One large matmul for the input projection of a block of steps, with
    # the bias; only the recurrent product h @ w_h has to wait for the
    # previous step. Without the kernels, per step a plain MatMul and an
    # Add: with the bias added per step, Grappler's remapper fused MatMul,
    # BiasAdd and Add into one oneDNN op that first copies its addend into
    # the output (a reorder per step), and the forward step took 0.19
    # instead of 0.10 ms on small (two layers side by side); training steps
    # 1-6 % faster on small, equal on medium and large (median, in-process
    # interleaved).
    for x_t in tf.unstack(tf.nn.bias_add(tf.tensordot(block, w_x, 1), bias)):
      gates = product(h, x_t)
      i, j, f, o = tf.split(gates, 4, axis=1)
      i, ci, f, o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f), tf.sigmoid(o)
      acts["c_prev"].append(c)
      acts["h_prev"].append(h)
      c = f * c + i * ci
      co = tf.tanh(c)
      h = o * co
      for k, v in (("i", i), ("cs", c), ("f", f), ("o", o), ("ci", ci),
                   ("co", co)):
        acts[k].append(v)
      outputs.append(h)
  return outputs, acts


def _lstm_backward(x, kernel, bias, acts, d_outputs, d_c, d_h):
  """Backward pass of one LSTM layer, batched over time where it can be.

  The recurrence runs step by step with the fused elementwise gradient
  kernel LSTMBlockCellGrad (canonical gate layout) and one matmul per step
  for the recurrent input. The weight gradient is then ONE matmul over all
  time steps, and the input gradient one per block, instead of a small one
  per step (what BlockLSTMGrad does, and why it is slow on the CPU).

  Args:
    x: `[T, B, I]` layer inputs, or a list of time blocks `[C, B, I]`: the
      layer below can start on a block's input gradient while this layer
      works on the earlier steps.
    kernel, bias: the canonical weights.
    acts: per-step activations, as _lstm_basic_forward returns them.
    d_outputs: None, `[T, B, H]`, or a list of blocks like x's.
    d_c, d_h: `[B, H]` or None.

  Returns:
    (d_x: a list of blocks `[C, B, I]` like x's, d_c0, d_h0, d_kernel,
    d_bias).
  """
  blocks = _blocks(x)
  sizes = [b.shape[0] for b in blocks]
  input_size = blocks[0].shape[2]
  hidden = kernel.shape[1] // 4
  w_x, w_h = _split_kernel(kernel, input_size)
  product = _backward_product(w_h, acts["cs"][-1])
  zeros_h = tf.zeros([hidden], kernel.dtype)
  d_c = tf.zeros_like(acts["cs"][-1]) if d_c is None else d_c
  d_h = tf.zeros_like(acts["cs"][-1]) if d_h is None else d_h
  if d_outputs is None:
    d_out_blocks = [None] * len(blocks)
  elif tf.is_tensor(d_outputs) and len(blocks) > 1:
    d_out_blocks = tf.split(d_outputs, sizes)
  else:
    d_out_blocks = _blocks(d_outputs)
  gate_blocks, d_x = [None] * len(blocks), [None] * len(blocks)
  end = sum(sizes)
  for k in reversed(range(len(blocks))):
    start = end - sizes[k]
    x_steps = tf.unstack(blocks[k])
    d_out = (tf.unstack(d_out_blocks[k]) if d_out_blocks[k] is not None
             else None)
    d_gates = [None] * sizes[k]
    for s in reversed(range(sizes[k])):
      t = start + s
      if d_out is not None:
        d_h = d_h + d_out[s]
      step = {n: acts[n][t] for n in ("i", "cs", "f", "o", "ci", "co")}
      d_c, d_gates[s], _, _, _ = tf.raw_ops.LSTMBlockCellGrad(
          x=x_steps[s], cs_prev=acts["c_prev"][t], h_prev=acts["h_prev"][t],
          w=kernel, wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=bias,
          cs_grad=d_c, h_grad=d_h, use_peephole=False, **step)
      d_h = product(d_gates[s])
    gate_blocks[k] = tf.stack(d_gates)                       # [C, B, 4H]
    d_x[k] = tf.tensordot(gate_blocks[k], w_x, [[2], [1]])
    end = start
  flat_g = tf.reshape(_join(gate_blocks), [-1, 4 * hidden])  # [T*B, 4H]
  xh = tf.concat([_join(blocks), tf.stack(acts["h_prev"])], 2)  # [T,B,I+H]
  d_kernel = tf.matmul(tf.reshape(xh, [-1, input_size + hidden]), flat_g,
                       transpose_a=True)
  d_bias = tf.reduce_sum(flat_g, 0)
  return d_x, d_c, d_h, d_kernel, d_bias


@tf.custom_gradient
def _lstm_basic_layer(x, c0, h0, kernel, bias):
  """BASIC: the cell from matmul and elementwise ops; _lstm_backward."""
  outputs, acts = _lstm_basic_forward(x, c0, h0, kernel, bias)

  def grad(d_outputs, d_c, d_h):
    d_x, *rest = _lstm_backward(x, kernel, bias, acts, d_outputs, d_c, d_h)
    return [_join(d_x)] + rest

  return (tf.stack(outputs), acts["cs"][-1], outputs[-1]), grad


def _block_lstm(x, c0, h0, kernel, bias):
  """tf.raw_ops.BlockLSTM over all steps; returns its 7 outputs `[T, B, H]`."""
  zeros_h = tf.zeros([h0.shape[1]], kernel.dtype)
  # BlockLSTM (V1) has the canonical gate layout; its defaults (forget_bias
  # 1.0, cell_clip 3.0) differ from the model's, so both are passed. A
  # negative cell_clip turns clipping off.
  return tf.raw_ops.BlockLSTM(
      seq_len_max=tf.constant(x.shape[0], tf.int64), x=x, cs_prev=c0,
      h_prev=h0, w=kernel, wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=bias,
      forget_bias=0.0, cell_clip=-1.0, use_peephole=False)


@tf.custom_gradient
def _lstm_block_layer(x, c0, h0, kernel, bias):
  """BLOCK: the fused BlockLSTM forward; _lstm_backward.

  BlockLSTM's registered gradient (BlockLSTMGrad) computes the weight
  gradient as one small matmul per step; _lstm_backward gives the same
  numbers (tests compare them) faster on the CPU (small model: 6,409 against
  4,028 words per second with BlockLSTMGrad).
  """
  outputs = _block_lstm(x, c0, h0, kernel, bias)
  acts = {k: tf.unstack(v) for k, v in
          zip(("i", "cs", "f", "o", "ci", "co"), outputs[:6])}
  h = outputs[6]
  acts["c_prev"] = [c0] + acts["cs"][:-1]
  acts["h_prev"] = [h0] + tf.unstack(h)[:-1]

  def grad(d_outputs, d_c, d_h):
    d_x, *rest = _lstm_backward(x, kernel, bias, acts, d_outputs, d_c, d_h)
    return [_join(d_x)] + rest

  return (h, acts["cs"][-1], h[-1]), grad


def _build_basic(x, state, kernel, bias):
  outputs, c, h = _lstm_basic_layer(x, state.c, state.h, kernel, bias)
  return outputs, util.LSTMStateTuple(c, h)


def _build_block(x, state, kernel, bias):
  outputs, c, h = _lstm_block_layer(x, state.c, state.h, kernel, bias)
  return outputs, util.LSTMStateTuple(c, h)


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


def _basic_stack(x, states, kernels, biases, masks, chunk):
  """BASIC over all layers in one custom gradient, as a wavefront.

  Layer l + 1 consumes layer l's outputs a chunk of steps at a time
  instead of waiting for the whole sequence, and in the backward pass
  layer l consumes layer l + 1's input gradient a chunk at a time, so the
  layers' step-by-step recurrences overlap on two cores. A custom gradient
  per layer could not do this: its inputs and outputs are whole sequences.

  Args:
    x: `[T, B, I]` inputs of the first layer.
    states: one LSTMStateTuple of `[B, H]` tensors per layer.
    kernels, biases: one canonical kernel and bias per layer.
    masks: None or one `[T, B, H]` dropout mask per layer but the last.
    chunk: steps per chunk.

  Returns:
    (outputs of the last layer `[T, B, H]`, list of final LSTMStateTuple).
  """
  num_layers = len(kernels)
  masks = list(masks) if masks else []

  @tf.custom_gradient
  def stack(x, *args):
    # The weights come in as arguments, not from the enclosing scope, so
    # that the custom gradient returns their gradients.
    c0s, h0s, ks, bs = (args[k * num_layers:(k + 1) * num_layers]
                        for k in range(4))
    mask_blocks = [_blocks(m, chunk) for m in args[4 * num_layers:]]
    inputs, layer_inputs, layer_acts, finals = _blocks(x, chunk), [], [], []
    sizes = [b.shape[0] for b in inputs]
    for l in range(num_layers):
      layer_inputs.append(inputs)
      outputs, acts = _lstm_basic_forward(inputs, c0s[l], h0s[l], ks[l],
                                          bs[l])
      layer_acts.append(acts)
      finals.append((acts["cs"][-1], outputs[-1]))
      if l < num_layers - 1:
        inputs = [tf.stack(outputs[s - n:s]) for s, n in
                  zip(np.cumsum(sizes), sizes)]
        if mask_blocks:
          inputs = [b * m for b, m in zip(inputs, mask_blocks[l])]

    def grad(d_outputs, *d_states):
      d_cs, d_hs = d_states[:num_layers], d_states[num_layers:]
      d_c0s, d_h0s = [None] * num_layers, [None] * num_layers
      d_ks, d_bs = [None] * num_layers, [None] * num_layers
      d_out = _blocks(d_outputs, chunk)
      for l in reversed(range(num_layers)):
        d_out, d_c0s[l], d_h0s[l], d_ks[l], d_bs[l] = _lstm_backward(
            layer_inputs[l], ks[l], bs[l], layer_acts[l], d_out, d_cs[l],
            d_hs[l])
        if mask_blocks and l > 0:
          d_out = [d * m for d, m in zip(d_out, mask_blocks[l - 1])]
      return ([_join(d_out)] + d_c0s + d_h0s + d_ks + d_bs +
              [None] * len(mask_blocks))

    return ((tf.stack(outputs),) + tuple(c for c, _ in finals) +
            tuple(h for _, h in finals)), grad

  results = stack(x, *([s.c for s in states] + [s.h for s in states] +
                       list(kernels) + list(biases) + masks))
  return results[0], [util.LSTMStateTuple(c, h) for c, h in
                      zip(results[1:1 + num_layers], results[1 + num_layers:])]


def wavefront_chunk(hidden_size):
  """Steps per chunk of the BASIC wavefront (_basic_stack) for a model.

  Measured on 2 CPU cores, in one process, training steps of the variants
  interleaved, median step time: chunks of 4 steps make small (hidden 200)
  10 % and medium (650) 4 % faster than one layer after the other. On
  large (1500) both layers' step matmuls are bound by memory bandwidth:
  side by side they gain nothing, and chunks of 5 steps lost 6 %. There
  the layers run one after the other.
  """
  return 4 if hidden_size < 1024 else None


def lstm_stack(rnn_mode, x, states, kernels, biases, masks=None, chunk=None):
  """Runs all LSTM layers, with dropout masks between them.

  Args:
    rnn_mode: BASIC, BLOCK or CUDNN.
    x: `[T, B, I]` time-major inputs of the first layer.
    states: one LSTMStateTuple of `[B, H]` tensors per layer.
    kernels, biases: one canonical kernel and bias per layer.
    masks: None, or one `[T, B, H]` dropout mask (0 or 1 / keep_prob) per
      layer but the last, applied to that layer's outputs.
    chunk: for BASIC, the steps per chunk of the wavefront (_basic_stack).

  Returns:
    (outputs of the last layer `[T, B, H]`, list of final LSTMStateTuple).
  """
  if rnn_mode == BASIC and chunk:
    return _basic_stack(x, states, kernels, biases, masks, chunk)
  finals = []
  for l, (state, kernel, bias) in enumerate(zip(states, kernels, biases)):
    x, state = lstm_layer(rnn_mode, x, state, kernel, bias)
    if masks and l < len(kernels) - 1:
      x = x * masks[l]
    finals.append(state)
  return x, finals


# Below this probability of the target word, -log(p) loses precision (and
# an underflow to zero would make it inf); the loss is then computed from
# the logits instead.
_MIN_TARGET_PROB = 1e-30


def softmax_loss(inputs, softmax_w, softmax_b, labels):
  """Cross-entropy of the softmax layer, with a hand-written gradient.

  Equal to tf.nn.sparse_softmax_cross_entropy_with_logits applied to
  `inputs @ softmax_w + softmax_b`, with less work on the `[N, V]` logits
  (N = batch x steps rows, V = vocabulary) besides the three matmuls. With
  the kernels (lstm_kernels.py: float32 on a CPU with AVX-512) one op takes
  the logits from the matmul and, a row at a time while the row is in the
  L1 cache, adds the bias and writes softmax - onehot over them, with the
  loss (`_softmax_loss_fused`). Otherwise the forward pass is one fused
  softmax (oneDNN) and the backward pass writes p - onehot into it in place
  (`_softmax_loss_ops`). Both apply the per-row scale of the incoming
  gradient to the `[N, H]` side of the gradient's matmuls.

  Args:
    inputs: `[N, H]` outputs of the last layer.
    softmax_w: `[H, V]`; softmax_b: `[V]`.
    labels: int32 `[N]` target ids.

  Returns:
    float32 `[N]` losses. The logits and the softmax are float32 even with
    --use_fp16: exp of fp16 logits over a 10k vocabulary loses most of the
    precision that matters.
  """
  if _cpu_kernels(inputs) is not None:
    return _softmax_loss_fused(inputs, softmax_w, softmax_b, labels)
  return _softmax_loss_ops(inputs, softmax_w, softmax_b, labels)


def _softmax_grads(inputs, softmax_w, d_logits, d_loss):
  """The softmax layer's gradients from d_logits = softmax - onehot.

  diag(d_loss) scales the narrow `[N, H]` side of each product instead of
  the `[N, V]` one, and the bias gradient is one more row of the
  weight-gradient product (a separate column sum is a slow pass).

  Args:
    inputs: `[N, H]`; softmax_w: `[H, V]`.
    d_logits: `[N, V]` softmax - onehot, in the dtype of inputs.
    d_loss: float32 `[N]`, the gradient of the losses.

  Returns:
    (d_inputs `[N, H]`, d_w `[H, V]`, d_b `[V]`).
  """
  scale = tf.cast(d_loss, inputs.dtype)[:, None]
  d_inputs = tf.matmul(d_logits, softmax_w, transpose_b=True) * scale
  scaled = tf.concat([inputs, tf.ones_like(scale)], 1) * scale  # [N, H+1]
  d_wb = tf.matmul(scaled, d_logits, transpose_a=True)          # [H+1, V]
  d_w, d_b = tf.split(d_wb, [inputs.shape[1], 1])
  return d_inputs, d_w, d_b[0]


@tf.custom_gradient
def _softmax_loss_fused(inputs, softmax_w, softmax_b, labels):
  """softmax_loss with the kernels' SoftmaxCrossEntropy (float32 only)."""
  # No bias in the matmul: oneDNN adds it in a pass of its own over the
  # [N, V] output, and SoftmaxCrossEntropy adds it in its first pass.
  loss, d_logits = lstm_kernels.load().softmax_cross_entropy(
      tf.matmul(inputs, softmax_w), softmax_b, labels)

  def grad(d_loss):
    return _softmax_grads(inputs, softmax_w, d_logits, d_loss) + (None,)

  return loss, grad


@tf.custom_gradient
def _softmax_loss_ops(inputs, softmax_w, softmax_b, labels):
  """softmax_loss with TensorFlow's ops (any dtype or device)."""
  logits = tf.cast(tf.matmul(inputs, softmax_w) + softmax_b, tf.float32)
  probs = tf.nn.softmax(logits)
  index = tf.stack([tf.range(tf.shape(labels)[0]), labels], axis=1)
  target = tf.gather_nd(probs, index)

  def exact():
    return (tf.reduce_logsumexp(logits, axis=1) -
            tf.gather_nd(logits, index))

  loss = tf.cond(tf.reduce_min(target) >= _MIN_TARGET_PROB,
                 lambda: -tf.math.log(target), exact)

  def grad(d_loss):
    num_rows, vocab = tf.shape(probs)[0], probs.shape[1]
    # InplaceSub writes p - onehot into probs' buffer without a copy (a
    # scatter copies all N x V values). Only the forward pass reads probs
    # besides this, so it must have finished: hence the control dependency.
    with tf.control_dependencies([loss]):
      flat = tf.raw_ops.InplaceSub(
          x=tf.reshape(probs, [-1, 1]), i=tf.range(num_rows) * vocab + labels,
          v=tf.ones([num_rows, 1], probs.dtype))
    d_logits = tf.cast(tf.reshape(flat, [num_rows, vocab]), inputs.dtype)
    return _softmax_grads(inputs, softmax_w, d_logits, d_loss) + (None,)

  return loss, grad


def dropout_mask(shape, keep_prob, dtype):
  """A mask: each entry 1 / keep_prob with probability keep_prob, else 0.

  Drawn as tf.nn.dropout draws it (uniform >= 1 - keep_prob).
  """
  keep = tf.random.uniform(shape) >= 1 - keep_prob
  return tf.cast(keep, dtype) / tf.cast(keep_prob, dtype)


class PTBModel(object):
  """The PTB model.

  The graph keeps each tower's LSTM state in a local variable, so a step
  needs no feed: `update_state` stores the final state that the next call's
  `initial_state` reads, and `reset_state` zeroes it at the start of a pass.
  """

  def __init__(self, is_training, config, input_, devices=("/cpu:0",),
               use_fp16=False, replica=(0, 1)):
    """Builds the model.

    Args:
      is_training: build dropout and the training op.
      config: a config instance.
      input_: a PTBInput with `len(devices)` towers.
      devices: one device per tower.
      use_fp16: float16 variables and activations.
      replica: (index, count) of the processes that train together
        (between-graph replication); with several, each step's update is
        the average of one gradient from each (util.synchronous_update).
    """
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
        optimizer = util.ClippedGradientDescent(self._lr, config.max_grad_norm)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        if replica[1] > 1:
          self._train_op = util.synchronous_update(
              zip(grads, params), optimizer, global_step, *replica)
        else:
          self._train_op = optimizer.apply_gradients(
              zip(grads, params), global_step=global_step)
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

    # The original fed the state through feed_dict, and with --num_gpus=0
    # it re-imported zero replicas of the training state: nothing was fed
    # and every step started from zeros. Here the state lives in the graph,
    # the same way on every device setting.
    state_var = util.local_variable(
        tf.zeros([num_layers, 2, batch_size, size], dtype), "lstm_state")
    initial_state = util.unpack_state(state_var.read_value(), num_layers)

    # Time-major from here on: [steps, batch, ...].
    inputs = tf.nn.embedding_lookup(embedding, tf.transpose(input_data))
    # Dropout as explicit masks, on the embeddings, between layers and
    # before the softmax: the BASIC wavefront applies the ones between
    # layers a chunk at a time.
    masks = {}
    if keep_prob < 1:
      shape = [input_data.shape[1], batch_size, size]
      masks = {"input": dropout_mask(shape, keep_prob, dtype),
               "layers": [dropout_mask(shape, keep_prob, dtype)
                          for _ in range(num_layers - 1)],
               "output": dropout_mask(shape, keep_prob, dtype)}
      inputs *= masks["input"]
    inputs, final_state = lstm_stack(
        self._rnn_mode, inputs, initial_state, params[1:-2:2], params[2:-2:2],
        masks.get("layers"), chunk=wavefront_chunk(size))
    if masks:
      inputs *= masks["output"]

    output = tf.reshape(inputs, [-1, size])
    loss = softmax_loss(output, softmax_w, softmax_b,
                        tf.reshape(tf.transpose(targets), [-1]))
    if weights is not None:
      loss *= tf.reshape(tf.transpose(weights), [-1])
    cost = tf.reduce_sum(loss) / tf.cast(batch_size, tf.float32)
    return cost, {"var": state_var, "initial": initial_state,
                  "final": tuple(final_state), "dropout": masks}

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
  def dropout_masks(self):
    """The first tower's dropout masks: {} without dropout, else a dict.

    "input" (on the embeddings), "layers" (one per layer but the last, on
    its outputs) and "output" (before the softmax), each `[steps, batch,
    hidden]` of 0 and 1 / keep_prob, drawn anew at every session call.
    """
    return self._states[0]["dropout"]

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

  @property
  def state_variables(self):
    """Each tower's `[layers, 2, batch, hidden]` LSTM state variable."""
    return [s["var"] for s in self._states]


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


def run_epoch(session, model, eval_op=None, verbose=False, start=None,
              on_step=None):
  """Runs the model over one pass of its input.

  Args:
    session: a tf.compat.v1.Session.
    model: a PTBModel.
    eval_op: an op to run with every step (the training op), or None.
    verbose: print the progress line about ten times.
    start: (step, costs) to resume a pass part-way, with the model's state
      and input position restored from a checkpoint; None starts afresh.
    on_step: called as on_step(step, cost, costs) after every session call;
      it may raise to stop the pass.

  Returns:
    The perplexity of the pass.
  """
  start_time = time.time()
  data = model.input
  first, costs = start or (0, 0.0)
  if start is None:
    session.run(model.reset_state)
  iters = sum(data.num_steps * data.steps_in_call(c) for c in range(first))
  fetches = {"cost": model.cost, "state": model.update_state}
  if eval_op is not None:
    fetches["eval_op"] = eval_op
  # The original printed when step % (epoch_size // 10) == 10, which divides
  # by zero below ten steps and prints nothing below 110; this keeps its
  # cadence on long epochs and still prints about ten lines on short ones.
  every = max(1, data.epoch_size // 10)
  words_per_window = data.batch_size * data.num_towers * data.num_steps
  for step in range(first, data.num_calls):
    cost = session.run(fetches)["cost"]
    costs += cost
    iters += data.num_steps * data.steps_in_call(step)
    if on_step is not None:
      on_step(step, cost, costs)
    if verbose and step % every == 10 % every:
      print("%.3f perplexity: %.3f speed: %.0f wps" %
            (step * 1.0 / data.epoch_size, np.exp(costs / iters),
             (step + 1 - first) * words_per_window /
             (time.time() - start_time)), flush=True)
  return np.exp(costs / iters)


def epoch_learning_rate(config, epoch):
  """The learning rate of epoch `epoch` (from 0): decayed after max_epoch."""
  return config.learning_rate * config.lr_decay ** max(
      epoch + 1 - config.max_epoch, 0.0)


def get_config(model, rnn_mode=None):
  """Returns a fresh config instance for `model`, with `rnn_mode` if given."""
  if model not in CONFIGS:
    # The original raised ValueError("Invalid model: %s", model): a tuple,
    # never formatted. Here the message is formatted and lists the choices.
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


# Upper bounds that no machine of today trains within a lifetime: a value
# above them is a typo (an extra zero or two), not a benchmark.
_MAX_INTS = {"num_layers": 1000, "num_steps": 100000, "hidden_size": 100000,
             "max_epoch": 1000000, "max_max_epoch": 1000000,
             "batch_size": 1000000, "vocab_size": 100000000}


def validate_config(config):
  """Refuses values that cannot train, with the field named."""
  for name, limit in _MAX_INTS.items():
    value = getattr(config, name)
    if not isinstance(value, int) or value <= 0:
      raise UserError("config %s=%r must be a positive integer"
                      % (name, value), exit_code=2)
    if value > limit:
      raise UserError("config %s=%d is absurdly large (more than %d)"
                      % (name, value, limit), exit_code=2)
  for name in ("init_scale", "learning_rate", "max_grad_norm", "lr_decay"):
    value = getattr(config, name)
    if not value > 0 or not np.isfinite(value):
      raise UserError("config %s=%r must be a positive number"
                      % (name, value), exit_code=2)
  if not 0 < config.keep_prob <= 1:
    raise UserError("config keep_prob=%r must be in (0, 1]" % config.keep_prob,
                    exit_code=2)


def resolve_config(model, rnn_mode, num_gpus, overrides):
  """The config a run uses: model, rnn_mode flag, CPU default, overrides."""
  config = get_config(model, rnn_mode)
  if rnn_mode is None and num_gpus == 0:
    # On the CPU the hand-batched BASIC cell trains fastest (see README,
    # "Performance"); the configs keep BLOCK, the GPU default.
    config.rnn_mode = CPU_RNN_MODE
  if overrides:
    changed = apply_overrides(config, overrides)
    print("Config overrides: %s" % ", ".join("%s=%s" % kv
                                             for kv in changed.items()))
  validate_config(config)
  return config


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


def build_model(name, is_training, config, data, devices, use_fp16=False,
                steps_per_call=1, reuse=False, replica=(0, 1)):
  """Builds one PTBInput and PTBModel under `name` ("Train", "Valid", ...).

  The weights live in the variable scope "Model": the first model creates
  them (reuse=False), the others share them. `replica` is (worker index,
  workers) when several processes train together.
  """
  initializer = tf.compat.v1.random_uniform_initializer(
      -config.init_scale, config.init_scale)
  with tf.compat.v1.name_scope(name):
    input_ = PTBInput(config=config, data=data, name=name + "Input",
                      num_towers=len(devices), steps_per_call=steps_per_call,
                      replica=replica)
    with tf.compat.v1.variable_scope("Model", reuse=reuse,
                                     initializer=initializer):
      return PTBModel(is_training=is_training, config=config, input_=input_,
                      devices=devices, use_fp16=use_fp16,
                      replica=replica if is_training else (0, 1))


def build_models(config, eval_config, data, devices, use_fp16, eval_unroll,
                 replica=(0, 1)):
  """Builds the Train, Valid and Test models, sharing one set of variables.

  Validation and test run `eval_unroll // num_steps` windows per session
  call (an in-graph unroll over consecutive windows, state carried inside):
  the same numbers as one window per call, in far fewer calls.

  Returns:
    A dict with the models under "train", "valid" and "test".
  """
  train_data, valid_data, test_data = data
  return {
      "train": build_model("Train", True, config, train_data, devices,
                           use_fp16, replica=replica),
      "valid": build_model("Valid", False, config, valid_data, devices[:1],
                           use_fp16, max(1, eval_unroll // config.num_steps),
                           reuse=True),
      "test": build_model("Test", False, eval_config, test_data, devices[:1],
                          use_fp16, max(1, eval_unroll // eval_config.num_steps),
                          reuse=True),
  }


class Progress(object):
  """Where training is, kept in variables so that checkpoints carry it.

  epoch: epochs completed; step: training calls done in the epoch after them
  (the epoch size once its training pass is done); costs: the summed cost of
  those calls, so a resumed epoch prints the same train perplexity.
  """

  def __init__(self):
    with tf.compat.v1.variable_scope("Progress"):
      self._vars = [
          tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                name="epoch"),
          tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                name="epoch_step"),
          tf.compat.v1.Variable(0.0, dtype=tf.float64, trainable=False,
                                name="epoch_costs")]
      self._values = [tf.compat.v1.placeholder(v.dtype, []) for v in self._vars]
      self._assign = tf.group(*[v.assign(p)
                                for v, p in zip(self._vars, self._values)])

  def set(self, session, epoch, step, costs):
    session.run(self._assign, dict(zip(self._values, (epoch, step, costs))))

  def get(self, session):
    epoch, step, costs = session.run(self._vars)
    return int(epoch), int(step), float(costs)


class Checkpointer(object):
  """Saves and restores a run in `save_path`, refusing foreign checkpoints."""

  def __init__(self, save_path, var_list):
    self._save_path = save_path
    self._var_list = var_list
    self._saver = tf.compat.v1.train.Saver(var_list, max_to_keep=2,
                                           save_relative_paths=True)

  @staticmethod
  def check_writable(save_path):
    """Creates `save_path` if needed and proves a file can be written there."""
    try:
      os.makedirs(save_path, exist_ok=True)
      probe = os.path.join(save_path, ".write_test.%d" % os.getpid())
      with open(probe, "w") as f:
        f.write("ok")
      os.remove(probe)
    except OSError as e:
      raise UserError("--save_path=%s cannot be written: %s"
                      % (save_path, e.strerror or e)) from None

  def latest(self):
    return tf.train.latest_checkpoint(self._save_path)

  def check_compatible(self, ckpt):
    """Raises UserError naming the first variable whose shape differs."""
    shapes = tf.train.load_checkpoint(ckpt).get_variable_to_shape_map()
    ours = {v.op.name: v.shape.as_list() for v in self._var_list}
    for name in sorted(set(shapes) | set(ours)):
      theirs, here = shapes.get(name), ours.get(name)
      if theirs != here:
        raise UserError(
            "--save_path=%s holds a checkpoint of another configuration: %s "
            "is %s there and %s here (hidden_size, num_layers, vocab_size, "
            "batch_size, num_steps and the number of towers must match); use "
            "another --save_path" % (
                self._save_path, name,
                "absent" if theirs is None else theirs,
                "absent" if here is None else here))

  def restore(self, session):
    """Restores the latest checkpoint after checking it fits; returns it."""
    ckpt = self.latest()
    self.check_compatible(ckpt)
    self._saver.restore(session, ckpt)
    return ckpt

  def save(self, session, global_step):
    # Saver writes into temporary files and renames them, and moves the
    # `checkpoint` pointer only afterwards: a crash mid-save leaves the
    # previous checkpoint usable.
    return self._saver.save(session, os.path.join(self._save_path,
                                                  "model.ckpt"),
                            global_step=global_step)


class SignalCatcher(object):
  """Turns SIGINT/SIGTERM into a flag that the training loop polls.

  A signal never interrupts a session call or a checkpoint write half-way:
  the loop notices it after the step, saves, and stops.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.signum = None
    self._previous = {}

  def _handle(self, signum, _):
    self.signum = signum

  def __enter__(self):
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class TrainingRun(object):
  """One run of the training loop: graph, session, checkpoints, signals.

  Single process by default. With a cluster (cluster.Cluster), this process
  is one worker of a synchronous data-parallel job: its graph puts the
  variables on the ps tasks; worker 0, the chief, initialises, restores,
  validates, tests and saves; every worker trains on its own rows and prints
  its progress lines.
  """

  def __init__(self, config, eval_config, data, devices, options):
    self.config = config
    self.options = options
    self.save_path = options["save_path"]
    self.sampler = options.get("sampler")
    self.summary = options.get("summary") or {}
    self.cluster = options.get("cluster")
    self.chief = self.cluster is None or cluster_lib.is_chief(self.cluster)
    self.devices = devices
    self.where = {"phase": "startup", "epoch": 0, "step": 0, "costs": 0.0}
    self.first_calls_done = set()  # phases whose first call has run
    replica = ((self.cluster.task_index, len(self.cluster.worker_hosts))
               if self.cluster else (0, 1))
    self.graph = tf.Graph()
    with self.graph.as_default(), tf.compat.v1.device(
        cluster_lib.device_setter(self.cluster) if self.cluster else None):
      if options["seed"] is not None:
        tf.compat.v1.set_random_seed(options["seed"])
      models = build_models(config, eval_config, data, devices,
                            options["use_fp16"], options["eval_unroll"],
                            replica)
      self.m, self.mvalid, self.mtest = (models["train"], models["valid"],
                                         models["test"])
      self.progress = Progress()
      self.global_step = tf.compat.v1.train.get_global_step()
      self.weights_finite = tf.reduce_all([
          tf.reduce_all(tf.math.is_finite(v))
          for v in tf.compat.v1.trainable_variables()])
      self.global_init = tf.compat.v1.global_variables_initializer()
      self.local_init = tf.compat.v1.local_variables_initializer()
      self.done = cluster_lib.done_ops(self.cluster) if self.cluster else []
      self.checkpointer = None
      if self.save_path and self.chief:
        Checkpointer.check_writable(self.save_path)
        # The training pass's LSTM state and data position are saved too, so
        # a run resumed mid-epoch continues exactly where it stopped.
        self.checkpointer = Checkpointer(
            self.save_path, tf.compat.v1.global_variables() +
            self.m.state_variables + [self.m.input.position])

  def _session(self):
    config = session_config(self.devices, self.options["intra_op_threads"],
                            self.options["inter_op_threads"])
    if not self.cluster:
      return tf.compat.v1.Session(graph=self.graph, config=config)
    timeout = self.options["cluster_timeout"]
    server = cluster_lib.start_server(self.cluster)
    cluster_lib.wait_for(self.cluster.ps_hosts, "ps", timeout)
    return tf.compat.v1.Session(
        server.target, graph=self.graph,
        config=cluster_lib.session_config(self.cluster, config, timeout))

  def _initialize(self, session):
    """Initialises or restores; returns (epoch, step, costs) to start from."""
    ckpt = self.checkpointer.latest() if self.checkpointer else None
    if not self.chief:
      self._wait_for_chief(session)
    elif ckpt:
      # Restoring initialises the variables: other workers wait for exactly
      # that, so they never see freshly initialised weights.
      session.run(self.local_init)
      self.checkpointer.restore(session)
    else:
      session.run([self.global_init, self.local_init])
    start = self.progress.get(session) if (ckpt or not self.chief) else (
        0, 0, 0.0)
    if self.cluster:
      start = (start[0], 0, 0.0)  # A cluster saves only at an epoch's end.
    if ckpt:
      print("Resuming from epoch %d step %d of %s"
            % (start[0] + 1, start[1], self.save_path), flush=True)
    return start

  def _wait_for_chief(self, session):
    deadline = time.time() + self.options["cluster_timeout"]
    with self.graph.as_default():
      uninitialized = tf.compat.v1.report_uninitialized_variables(
          tf.compat.v1.global_variables())
    while len(session.run(uninitialized)):
      if time.time() > deadline:
        raise UserError("worker %d: the chief (worker 0) did not initialise "
                        "the variables within %.0f s"
                        % (self.cluster.task_index,
                           self.options["cluster_timeout"]))
      time.sleep(0.5)
    session.run(self.local_init)

  def save(self, session, epoch, step, costs):
    """Records the progress and writes a checkpoint; returns its path."""
    # A finite cost does not prove that the update after it was finite.
    if not session.run(self.weights_finite):
      raise UserError("training diverged in epoch %d: the weights are not "
                      "finite; the last good checkpoint in %s is kept"
                      % (self.where["epoch"], self.save_path))
    self.progress.set(session, epoch, step, costs)
    return self.checkpointer.save(session, self.global_step)

  def _interrupted(self, session, signum):
    where = self.where
    if self.checkpointer is None:
      saved = "nothing saved (%s)" % ("no --save_path" if self.chief else
                                      "only the chief saves")
    elif where["phase"] == "train" and not self.cluster:
      saved = "checkpoint saved to %s" % self.save(
          session, where["epoch"] - 1, where["step"] + 1, where["costs"])
    elif where["phase"] == "valid" and not self.cluster:
      saved = "checkpoint saved to %s" % self.save(
          session, where["epoch"] - 1, self.m.input.num_calls,
          where["train_costs"])
    else:
      # Workers of a cluster resume together only from an epoch's end.
      saved = "the checkpoint of the last finished epoch is in %s" % (
          self.save_path)
    return Stop("interrupted by %s in the %s pass of epoch %d at step %d (%s); "
                "run the same command to resume"
                % (signal.Signals(signum).name, where["phase"], where["epoch"],
                   where["step"], saved), 128 + signum)

  def _on_step(self, session, signals, step, cost, costs):
    where = self.where
    where["step"], where["costs"] = step, costs
    if self.sampler is not None:
      self.sampler.set_phase(where["phase"], where["epoch"], step)
    if where["phase"] not in self.first_calls_done:
      # A graph's first call optimised it and built its kernels, code that
      # later calls never run again.
      self.first_calls_done.add(where["phase"])
      monitor.release_library_pages()
    if signals.signum is not None:
      raise self._interrupted(session, signals.signum)
    if where["phase"] != "train":
      return
    if not np.isfinite(cost):
      raise UserError(
          "training diverged at epoch %d step %d: the cost is %s; %s"
          % (where["epoch"], step + 1, cost,
             "the last good checkpoint in %s is kept" % self.save_path
             if self.checkpointer else "nothing was saved"))
    every = self.options.get("save_every_steps")
    if self.checkpointer and every and (step + 1) % every == 0:
      self.save(session, where["epoch"] - 1, step + 1, costs)

  def _epoch(self, session, i, resume, on_step, writer):
    """Trains epoch i (from 0), validates on the chief; records it."""
    config, m = self.config, self.m
    epoch_start = time.time()
    lr = epoch_learning_rate(config, i)
    m.assign_lr(session, lr)
    print("Epoch: %d Learning rate: %.3f" % (i + 1, session.run(m.lr)))
    self.where.update(phase="train", epoch=i + 1, step=0, costs=0.0)
    train_perplexity = run_epoch(session, m, eval_op=m.train_op, verbose=True,
                                 start=resume, on_step=on_step)
    train_seconds = time.time() - epoch_start
    wps = _epoch_words(m, resume) / train_seconds
    print("Epoch: %d Train Perplexity: %.3f" % (i + 1, train_perplexity))
    if not self.chief:
      return
    if self.cluster:
      wps *= len(self.cluster.worker_hosts)
      print("Epoch: %d Cluster speed: %.0f wps" % (i + 1, wps))
    self.where.update(phase="valid", step=0,
                      train_costs=(np.log(train_perplexity) *
                                   m.input.epoch_size * m.input.num_steps))
    valid_start = time.time()
    valid_perplexity = run_epoch(session, self.mvalid, on_step=on_step)
    print("Epoch: %d Valid Perplexity: %.3f" % (i + 1, valid_perplexity))
    if self.checkpointer:
      self.save(session, i + 1, 0, 0.0)
    if writer:
      _write_scalars(writer, session.run(self.global_step), {
          "Training Loss": np.log(train_perplexity) * config.num_steps,
          "Learning Rate": lr,
          "Validation Loss": np.log(valid_perplexity) * config.num_steps})
    self.summary.setdefault("epochs", []).append({
        "epoch": i + 1, "learning_rate": lr,
        "train_perplexity": float(train_perplexity),
        "valid_perplexity": float(valid_perplexity),
        "train_wps": wps, "train_seconds": train_seconds,
        "valid_seconds": time.time() - valid_start})
    _publish(self.summary, self.options, status="running")

  def run(self):
    """Trains all epochs, tests; prints the SPEC lines."""
    with self._session() as session, SignalCatcher() as signals:
      first_epoch, first_step, first_costs = self._initialize(session)
      # Start-up is over; the library code it ran need not stay resident.
      monitor.release_library_pages()
      # Created only now, so that a refused checkpoint leaves the directory
      # exactly as it was.
      writer = (tf.compat.v1.summary.FileWriter(self.save_path)
                if self.checkpointer else None)

      def on_step(step, cost, costs):
        self._on_step(session, signals, step, cost, costs)

      try:
        for i in range(first_epoch, self.config.max_max_epoch):
          resume = ((first_step, first_costs)
                    if i == first_epoch and first_step else None)
          self._epoch(session, i, resume, on_step, writer)
        if self.chief:
          self.where.update(phase="test", epoch=self.config.max_max_epoch,
                            step=0)
          test_perplexity = run_epoch(session, self.mtest, on_step=on_step)
      except Stop as e:
        _publish(self.summary, self.options, status=(
            "failed" if isinstance(e, UserError) else "interrupted"))
        raise
      except tf.errors.OpError as e:
        if not self.cluster:
          raise
        _publish(self.summary, self.options, status="failed")
        raise UserError(
            "worker %d lost the cluster in the %s pass of epoch %d (%s: %s); "
            "a ps or worker task stopped, or made no progress within "
            "--cluster_timeout=%.0f s"
            % (self.cluster.task_index, self.where["phase"],
               self.where["epoch"], type(e).__name__,
               e.message.splitlines()[0] if e.message else "",
               self.options["cluster_timeout"])) from None
      if self.chief:
        print("Test Perplexity: %.3f" % test_perplexity)
        self.summary["test_perplexity"] = float(test_perplexity)
      _print_peak_memory(self.devices)
      if self.checkpointer:
        print("Saving model to %s." % self.save_path)
        self.checkpointer.save(session, self.global_step)
      session.run(self.done)
      _publish(self.summary, self.options, status="finished")
      if writer:
        writer.close()


def train(config, eval_config, data, devices, options):
  """Trains, validates and tests; prints the SPEC lines.

  Args:
    config, eval_config: the training and the test configs.
    data: (train_ids, valid_ids, test_ids).
    devices: training tower devices.
    options: dict of plain values from the flags (see main).
  """
  TrainingRun(config, eval_config, data, devices, options).run()


def _epoch_words(model, resume):
  """Words the training pass processed in this process (not before resume)."""
  data = model.input
  done = resume[0] if resume else 0
  return ((data.num_calls - done) * data.batch_size * data.num_towers *
          data.num_steps)


def _print_peak_memory(devices):
  print("Peak RSS: %.0f MiB" % monitor.peak_rss_mib())
  for device in devices:
    if device.startswith("/gpu"):
      name = "GPU:%s" % device.split(":")[-1]
      peak = tf.config.experimental.get_memory_info(name)["peak"]
      print("Peak GPU memory: %.0f MiB (%s)" % (peak / 2**20, name))


def _publish(summary, options, status):
  """Rewrites the --summary_json file (atomically), if one was asked for."""
  path = options.get("summary_json")
  if not path:
    return
  summary["status"] = status
  summary["wall_seconds"] = time.time() - options["start_time"]
  summary["peak_rss_mib"] = monitor.peak_rss_mib()
  monitor.write_json_atomic(path, summary)


def _write_scalars(writer, step, values):
  summary = tf.compat.v1.Summary(value=[
      tf.compat.v1.Summary.Value(tag=tag, simple_value=float(v))
      for tag, v in values.items()])
  writer.add_summary(summary, step)
  writer.flush()


def load_data(data_path, config, num_towers=1):
  """Reads the corpus; checks it fits the config. Returns the three id lists.

  Every check happens here, before anything is built or written.
  """
  try:
    train_data, valid_data, test_data, vocab_size = reader.ptb_raw_data(
        data_path)
    if vocab_size > config.vocab_size:
      raise UserError(
          "the training corpus has %d distinct words but the config's "
          "vocab_size is %d: raise vocab_size (e.g. --config_overrides="
          "vocab_size=%d) or use a smaller corpus"
          % (vocab_size, config.vocab_size, vocab_size))
    for name, ids, rows, steps in (
        ("ptb.train.txt", train_data, config.batch_size * num_towers,
         config.num_steps),
        ("ptb.valid.txt", valid_data, config.batch_size, config.num_steps),
        ("ptb.test.txt", test_data, 1, 1)):
      reader.check_epoch_size(len(ids), rows, steps, name)
  except reader.DataError as e:
    raise UserError(str(e)) from None
  return train_data, valid_data, test_data


def main(_):
  start_time = time.time()
  try:
    cluster = cluster_lib.from_flags(
        FLAGS.job_name, FLAGS.task_index, FLAGS.ps_hosts, FLAGS.worker_hosts,
        os.environ.get("TF_CONFIG"))
  except cluster_lib.ClusterError as e:
    raise UserError(str(e), exit_code=2) from None
  if not FLAGS.cluster_timeout > 0:
    raise UserError("--cluster_timeout=%s must be positive"
                    % FLAGS.cluster_timeout, exit_code=2)
  if cluster and cluster.job_name == "ps":
    try:
      cluster_lib.run_ps(cluster, FLAGS.cluster_timeout)
    except cluster_lib.ClusterError as e:
      raise UserError(str(e)) from None
    return
  if cluster and FLAGS.save_every_steps:
    raise UserError("--save_every_steps is for one process: a cluster saves "
                    "at the end of every epoch", exit_code=2)
  if not FLAGS.data_path:
    raise UserError("Must set --data_path to PTB data directory "
                    "(simple-examples/data)", exit_code=2)
  config = resolve_config(FLAGS.model, FLAGS.rnn_mode, FLAGS.num_gpus,
                          FLAGS.config_overrides)
  devices = check_devices(FLAGS.num_gpus, config.rnn_mode, FLAGS.cpu_towers)
  if FLAGS.save_every_steps < 0:
    raise UserError("--save_every_steps=%d must be 0 or more"
                    % FLAGS.save_every_steps, exit_code=2)
  if not FLAGS.memory_interval > 0:
    raise UserError("--memory_interval=%s must be positive"
                    % FLAGS.memory_interval, exit_code=2)
  eval_config = copy.copy(config)
  eval_config.batch_size = 1
  eval_config.num_steps = 1

  options = {"save_path": FLAGS.save_path, "use_fp16": FLAGS.use_fp16,
             "intra_op_threads": FLAGS.intra_op_threads,
             "inter_op_threads": FLAGS.inter_op_threads,
             "eval_unroll": FLAGS.eval_unroll, "seed": FLAGS.seed,
             "save_every_steps": FLAGS.save_every_steps,
             "summary_json": FLAGS.summary_json, "start_time": start_time,
             "cluster": cluster, "cluster_timeout": FLAGS.cluster_timeout,
             "summary": {
                 "command": list(sys.argv), "model": FLAGS.model,
                 "rnn_mode": config.rnn_mode.upper(),
                 "config": config_fields(config),
                 "tensorflow_version": tf.__version__,
                 "python_version": platform.python_version(),
                 "devices": devices, "epochs": [], "test_perplexity": None}}
  data = load_data(FLAGS.data_path, config, len(devices) * (
      len(cluster.worker_hosts) if cluster else 1))
  # Started once the input is known to be good: a refused run writes nothing.
  sampler = None
  if FLAGS.memory_log:
    gpus = [d.replace("/gpu", "GPU") for d in devices if d.startswith("/gpu")]
    sampler = monitor.MemorySampler(
        FLAGS.memory_log, FLAGS.memory_interval,
        gpu_memory_fn=tf.config.experimental.get_memory_info, gpu_names=gpus)
    sampler.start()
  options["sampler"] = sampler
  try:
    train(config, eval_config, data, devices, options)
  except reader.DataError as e:
    raise UserError(str(e)) from None
  finally:
    if sampler is not None:
      sampler.stop()


def run_main(main_fn=None):
  """Entry point: graph mode, and user errors as one line without traceback."""
  tf.compat.v1.disable_eager_execution()
  # Saver's "Restoring parameters" lines and deprecation notices of the
  # TF1 API this port deliberately uses are noise next to its output.
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  try:
    app.run(main_fn or main)
  except Stop as e:
    print("%s: %s%s" % (os.path.basename(sys.argv[0]),
                        "error: " if isinstance(e, UserError) else "", e),
          file=sys.stderr)
    sys.exit(e.exit_code)


if __name__ == "__main__":
  run_main()
