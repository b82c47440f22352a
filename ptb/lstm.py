"""The LSTM layer in its three modes, and the stack of layers.

BASIC builds the cell from matmul and elementwise ops; BLOCK runs a fused
cell: the kernels' LstmCell after BASIC's products on the CPU,
tf.raw_ops.BlockLSTM elsewhere. Both have the hand-written backward pass of
lstm_backward.py. CUDNN runs one cuDNN call per layer (GPUs only). All take
time-major inputs `[T, B, I]`, a state of `[B, H]` tensors and the
canonical weights (kernel `[I + H, 4H]`, gates (i, j, f, o); bias `[4H]`),
so one checkpoint serves every mode.
"""

import tensorflow as tf

from ptb import kernels
from ptb import lstm_backward
from ptb import wavefront
from ptb.config import BASIC, BLOCK, CUDNN
import util


@tf.custom_gradient
def _lstm_basic_layer(x, c0, h0, kernel, bias):
  """BASIC: the cell from matmul and elementwise ops; lstm_backward.backward."""
  outputs, acts = lstm_backward.basic_forward(x, c0, h0, kernel, bias)

  def grad(d_outputs, d_c, d_h):
    d_x, *rest = lstm_backward.backward(x, kernel, bias, acts, d_outputs,
                                        d_c, d_h)
    return [lstm_backward.join_time(d_x)] + rest

  return (tf.stack(outputs), acts["cs"][-1], outputs[-1]), grad


def block_lstm(x, c0, h0, kernel, bias):
  """tf.raw_ops.BlockLSTM over all steps; returns its 7 outputs `[T, B, H]`."""
  zeros_h = tf.zeros([h0.shape[1]], kernel.dtype)
  # BlockLSTM (V1) has the canonical gate layout; its defaults (forget_bias
  # 1.0, cell_clip 3.0) differ from the model's, so both are passed. A
  # negative cell_clip turns clipping off.
  return tf.raw_ops.BlockLSTM(
      seq_len_max=tf.constant(x.shape[0], tf.int64), x=x, cs_prev=c0,
      h_prev=h0, w=kernel, wci=zeros_h, wcf=zeros_h, wco=zeros_h, b=bias,
      forget_bias=0.0, cell_clip=-1.0, use_peephole=False)


def _fused_cell(like):
  """The kernels' fused cell (LstmCell) for work like `like`, or None."""
  library = kernels.cpu_kernels(like)
  return library.lstm_cell if library is not None else None


def _block_forward(x, c0, h0, kernel, bias):
  """BLOCK's forward pass: (outputs `[T, B, H]`, per-step activations).

  On the CPU, with the kernels: BASIC's products (the inputs of all steps
  in one, then h @ w_h per step) and the kernels' fused cell (LstmCell).
  BlockLSTM's CPU kernel does one Eigen product of [x_t, h] per step, and
  trained slower than BASIC in every config. Elsewhere (GPUs, fp16, no
  kernels): BlockLSTM.
  """
  cell = _fused_cell(x)
  if cell is not None:
    outputs, acts = lstm_backward.basic_forward(x, c0, h0, kernel, bias, cell)
    return tf.stack(outputs), acts
  outputs = block_lstm(x, c0, h0, kernel, bias)
  acts = {k: tf.unstack(v) for k, v in
          zip(("i", "cs", "f", "o", "ci", "co"), outputs[:6])}
  h = outputs[6]
  acts["c_prev"] = [c0] + acts["cs"][:-1]
  acts["h_prev"] = [h0] + tf.unstack(h)[:-1]
  return h, acts


@tf.custom_gradient
def _lstm_block_layer(x, c0, h0, kernel, bias):
  """BLOCK: a fused cell forward (_block_forward); lstm_backward.backward.

  BlockLSTM's registered gradient (BlockLSTMGrad) computes the weight
  gradient as one small matmul per step; lstm_backward.backward gives the
  same numbers (tests compare them) faster on the CPU: the small model
  trains 1.6x faster with it.
  """
  h, acts = _block_forward(x, c0, h0, kernel, bias)

  def grad(d_outputs, d_c, d_h):
    d_x, *rest = lstm_backward.backward(x, kernel, bias, acts, d_outputs,
                                        d_c, d_h)
    return [lstm_backward.join_time(d_x)] + rest

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


_LAYER_BUILDERS = {BASIC: _build_basic, BLOCK: _build_block,
                   CUDNN: _build_cudnn}


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


def lstm_stack(rnn_mode, x, states, kernels, biases, masks=None, chunk=None):
  """Runs all LSTM layers, with dropout masks between them.

  Args:
    rnn_mode: BASIC, BLOCK or CUDNN.
    x: `[T, B, I]` time-major inputs of the first layer.
    states: one LSTMStateTuple of `[B, H]` tensors per layer.
    kernels, biases: one canonical kernel and bias per layer.
    masks: None, or one `[T, B, H]` dropout mask (0 or 1 / keep_prob) per
      layer but the last, applied to that layer's outputs.
    chunk: the steps per chunk of the wavefront (wavefront.py), for BASIC
      and for BLOCK where its fused cell is the kernels'.

  Returns:
    (outputs of the last layer `[T, B, H]`, list of final LSTMStateTuple).
  """
  cell = (lstm_backward.ops_cell if rnn_mode == BASIC else
          _fused_cell(x) if rnn_mode == BLOCK else None)
  if chunk and cell is not None:
    return wavefront.basic_stack(x, states, kernels, biases, masks, chunk,
                                 cell)
  finals = []
  for l, (state, kernel, bias) in enumerate(zip(states, kernels, biases)):
    x, state = lstm_layer(rnn_mode, x, state, kernel, bias)
    if masks and l < len(kernels) - 1:
      x = x * masks[l]
    finals.append(state)
  return x, finals
