"""The LSTM's forward and backward passes on every path, and the stack.

Four paths; the plan (ptb/plan.py, its part plan.Lstm) says which one each
model takes, and lstm_stack follows it:

  WAVEFRONT   BASIC (small, medium), and BLOCK where its cell is the
              kernels'. basic_stack: all layers in one custom gradient;
              basic_forward chunk by chunk, layer l + 1 starting on a chunk
              as soon as layer l has it; backward from the top layer down,
              likewise a chunk at a time.
  LAYER       the same, one layer after the other (large): one custom
              gradient per layer (_layer), basic_forward then backward.
  BLOCK_LSTM  BLOCK where the kernels' cell cannot run (GPUs, float16, no
              kernels; with bfloat16 products BASIC's cell runs instead):
              BlockLSTM forward (block_lstm), BASIC's backward.
  CUDNN_RNN   _build_cudnn: one CudnnRNNV3 per layer and its registered
              gradient, on the canonical weights converted at every step
              (_cudnn_params). GPUs only: devices.check_devices refuses it
              without one.

Every path runs on its tower's device: the CPU, or a GPU with --num_gpus.
On the first two the cell is core ops (ops_cell, BASIC) or the kernels'
fused LstmCell (BLOCK on the CPU), and the per-step recurrent products of
basic_forward and backward run on tf.matmul or on the kernels of
ptb/kernels.py (PackPanels, PanelMatMul), as the plan says.

The forward passes keep every step's activations in the layout of
BlockLSTM's outputs, so that one hand-written backward pass serves BASIC
and BLOCK: the recurrence step by step with the fused LSTMBlockCellGrad,
then the weight gradient as ONE matmul over all steps (BlockLSTMGrad does a
small one per step, which is slow on the CPU). Given a dict `factors`, the
backward pass also hands each kernel's gradient out as its factors
(low_rank_update.LowRankGradient).

All paths take time-major inputs `[T, B, I]`, a state of `[B, H]` tensors
and the canonical weights: kernel `[I + H, 4H]` with gate blocks (input,
candidate, forget, output), bias `[4H]`; one checkpoint serves every mode.
"""

import functools

import tensorflow as tf

from ptb import bfloat16
from ptb import kernels as kernels_lib
from ptb import low_rank_update
from ptb import plan as plan_lib
from ptb import recurrent_product
from ptb import transposed_product
from ptb import wavefront
from ptb.state import LSTMStateTuple


def ops_cell(gates, c):
  """The cell's elementwise part from core ops (BASIC's cell).

  Args:
    gates: `[B, 4H]`, the products and the bias (blocks i, j, f, o).
    c: `[B, H]`, the previous cell state.

  Returns:
    (i, cs, f, o, ci, co, h), each `[B, H]`, as BlockLSTM names them.
  """
  i, j, f, o = tf.split(gates, 4, axis=1)
  i, ci, f, o = tf.sigmoid(i), tf.tanh(j), tf.sigmoid(f), tf.sigmoid(o)
  cs = f * c + i * ci
  co = tf.tanh(cs)
  return i, cs, f, o, ci, co, o * co


def _cell(plan):
  """The cell that the plan.Lstm names, in ops_cell's form.

  ops_cell itself, or the kernels' fused LstmCell (BLOCK on the CPU;
  plan.py says why).
  """
  if plan.cell != plan_lib.FUSED_CELL:
    return ops_cell
  library = kernels_lib.load()
  return lambda gates, c: library.lstm_cell(gates, c, isa=plan.isa)


def basic_forward(plan, x, c, h, kernel, bias):
  """Forward pass from products and a cell, keeping what backward needs.

  Args:
    plan: the plan.Lstm: its cell (ops_cell, or the kernels' fused
      LstmCell) and its forward product.
    x: `[T, B, I]` inputs, or a list of time blocks `[C, B, I]`: the
      steps of a block wait only for that block's inputs.
    c, h: `[B, H]` initial state.
    kernel, bias: the canonical weights.

  Returns:
    (outputs: a list of T `[B, H]` tensors, per-step activations: a dict of
    lists of T `[B, H]` tensors under "i", "cs", "f", "o", "ci", "co" as
    BlockLSTM names them, and "c_prev", "h_prev").
  """
  blocks = wavefront.split_time(x)
  input_size = blocks[0].shape[2]
  w_x, w_h = recurrent_product.split_kernel(
      kernel, input_size, plan.products, recurrent_product.dtype(plan))
  acts = {k: [] for k in ("i", "cs", "f", "o", "ci", "co", "c_prev",
                          "h_prev")}
  outputs = []
  cell = _cell(plan)
  product = recurrent_product.forward(plan, w_h)
  for block in blocks:
    # One large matmul for the input projection of a block of steps, with
    # the bias; only the recurrent product h @ w_h has to wait for the
    # previous step. The bias is not added per step: Grappler would fuse
    # MatMul, BiasAdd and Add into one oneDNN op that first copies its
    # addend into the output, a reorder at every step.
    for x_t in tf.unstack(tf.nn.bias_add(
        bfloat16.tensordot(block, w_x, plan.products), bias)):
      acts["c_prev"].append(c)
      acts["h_prev"].append(h)
      step = cell(product(h, x_t), c)
      for k, v in zip(("i", "cs", "f", "o", "ci", "co"), step):
        acts[k].append(v)
      c, h = step[1], step[6]
      outputs.append(h)
  return outputs, acts


def backward(plan, x, kernel, bias, acts, d_outputs, d_c, d_h):
  """Backward pass of one LSTM layer, batched over time where it can be.

  The recurrence runs step by step with the fused elementwise gradient
  kernel LSTMBlockCellGrad (canonical gate layout) and one matmul per step
  for the recurrent input. The weight gradient is then ONE matmul over all
  time steps, and the input gradient one per block, instead of a small one
  per step (what BlockLSTMGrad does, and why it is slow on the CPU).

  Args:
    plan: the plan.Lstm: its backward product, and for each time block
      whether its input gradient is swapped.
    x: `[T, B, I]` layer inputs, or a list of time blocks `[C, B, I]`: the
      layer below can start on a block's input gradient while this layer
      works on the earlier steps.
    kernel, bias: the canonical weights.
    acts: per-step activations, as basic_forward returns them.
    d_outputs: None, `[T, B, H]`, or a list of blocks like x's.
    d_c, d_h: `[B, H]` or None.

  Returns:
    (d_x: a list of blocks `[C, B, I]` like x's, d_c0, d_h0, d_kernel,
    d_bias, (x_h, g): d_kernel's factors, d_kernel = x_h^T @ g with x_h
    `[T*B, I+H]` and g `[T*B, 4H]`).
  """
  blocks = wavefront.split_time(x)
  if len(blocks) != len(plan.input_gradients):
    raise ValueError("a plan of %d time blocks for %d" % (
        len(plan.input_gradients), len(blocks)))
  sizes = [b.shape[0] for b in blocks]
  input_size = blocks[0].shape[2]
  hidden = kernel.shape[1] // 4
  w_x, w_h = recurrent_product.split_kernel(
      kernel, input_size, plan.products, recurrent_product.dtype(plan))
  product = recurrent_product.backward(plan, w_h, acts["cs"][-1].shape[0])
  zeros_h = tf.zeros([hidden], kernel.dtype)
  d_c = tf.zeros_like(acts["cs"][-1]) if d_c is None else d_c
  d_h = tf.zeros_like(acts["cs"][-1]) if d_h is None else d_h
  if d_outputs is None:
    d_out_blocks = [None] * len(blocks)
  elif tf.is_tensor(d_outputs) and len(blocks) > 1:
    d_out_blocks = tf.split(d_outputs, sizes)
  else:
    d_out_blocks = wavefront.split_time(d_outputs)
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
    flat_gates = tf.reshape(gate_blocks[k], [-1, 4 * hidden])
    d_x[k] = tf.reshape(
        transposed_product.matmul_transposed(
            flat_gates, w_x, plan.input_gradients[k] == plan_lib.SWAPPED,
            plan.products),
        [sizes[k], -1, input_size])                           # [C, B, I]
    end = start
  flat_g = tf.reshape(wavefront.join_time(gate_blocks),
                      [-1, 4 * hidden])                       # [T*B, 4H]
  xh = tf.concat([wavefront.join_time(blocks), tf.stack(acts["h_prev"])],
                 2)                                           # [T, B, I+H]
  flat_xh = tf.reshape(xh, [-1, input_size + hidden])
  d_kernel = bfloat16.matmul(flat_xh, flat_g, plan.products, transpose_a=True,
                              isa=plan.isa)
  d_bias = tf.reduce_sum(flat_g, 0)
  return d_x, d_c, d_h, d_kernel, d_bias, (flat_xh, flat_g)


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


def _basic_layer_forward(plan, x, c0, h0, kernel, bias):
  """LAYER's forward: (outputs `[T, B, H]`, the last h, activations)."""
  outputs, acts = basic_forward(plan, x, c0, h0, kernel, bias)
  return tf.stack(outputs), outputs[-1], acts


def _block_lstm_forward(plan, x, c0, h0, kernel, bias):
  """BLOCK_LSTM's forward: BlockLSTM, its outputs as basic_forward's acts."""
  if plan.products != bfloat16.FLOAT32:
    raise ValueError("BlockLSTM cannot make bfloat16 products")
  outputs = block_lstm(x, c0, h0, kernel, bias)
  acts = {k: tf.unstack(v) for k, v in
          zip(("i", "cs", "f", "o", "ci", "co"), outputs[:6])}
  h = outputs[6]
  acts["c_prev"] = [c0] + acts["cs"][:-1]
  acts["h_prev"] = [h0] + tf.unstack(h)[:-1]
  return h, h[-1], acts


def _layer(forward, plan, x, state, kernel, bias, factors):
  """One layer in one custom gradient: `forward`, then backward.

  BlockLSTM's registered gradient (BlockLSTMGrad) computes the weight
  gradient as one small matmul per step; backward gives the same numbers
  (tests compare them) faster on the CPU.

  Args:
    forward: _basic_layer_forward or _block_lstm_forward.
    plan: the plan.Lstm.
    x: `[T, B, I]`; state: LSTMStateTuple of `[B, H]`.
    kernel, bias: the canonical weights.
    factors: None, or the dict that the backward pass puts the kernel's
      LowRankGradient into.

  Returns:
    (outputs `[T, B, H]`, final LSTMStateTuple).
  """
  @tf.custom_gradient
  def layer(x, c0, h0, kernel_t, bias_t):
    outputs, h, acts = forward(plan, x, c0, h0, kernel_t, bias_t)

    def grad(d_outputs, d_c, d_h):
      d_x, d_c0, d_h0, d_kernel, d_bias, pair = backward(
          plan, x, kernel_t, bias_t, acts, d_outputs, d_c, d_h)
      low_rank_update.hand_out(factors, kernel, *pair)
      return [wavefront.join_time(d_x), d_c0, d_h0, d_kernel, d_bias]

    return (outputs, acts["cs"][-1], h), grad

  outputs, c, h = layer(x, state.c, state.h, kernel, bias)
  return outputs, LSTMStateTuple(c, h)


def basic_stack(plan, x, states, kernels, biases, masks, factors=None):
  """The WAVEFRONT: all layers in one custom gradient, chunk by chunk.

  A custom gradient per layer could not overlap the layers: its inputs and
  outputs are whole sequences (wavefront.py says why they overlap).

  Args:
    plan: the plan.Lstm: its chunk, cell and products.
    x: `[T, B, I]` inputs of the first layer.
    states: one LSTMStateTuple of `[B, H]` tensors per layer.
    kernels, biases: one canonical kernel and bias per layer.
    masks: None or one `[T, B, H]` dropout mask per layer but the last.
    factors: None, or the dict that the backward pass puts each kernel's
      LowRankGradient into.

  Returns:
    (outputs of the last layer `[T, B, H]`, list of final LSTMStateTuple).
  """
  num_layers, chunk = len(kernels), plan.chunk
  masks = list(masks) if masks else []

  @tf.custom_gradient
  def stack(x, *args):
    # The weights come in as arguments, not from the enclosing scope, so
    # that the custom gradient returns their gradients.
    c0s, h0s, ks, bs = (args[k * num_layers:(k + 1) * num_layers]
                        for k in range(4))
    mask_blocks = [wavefront.split_time(m, chunk)
                   for m in args[4 * num_layers:]]
    inputs = wavefront.split_time(x, chunk)
    layer_inputs, layer_acts, finals = [], [], []
    sizes = [b.shape[0] for b in inputs]
    for l in range(num_layers):
      layer_inputs.append(inputs)
      outputs, acts = basic_forward(plan, inputs, c0s[l], h0s[l], ks[l],
                                    bs[l])
      layer_acts.append(acts)
      finals.append((acts["cs"][-1], outputs[-1]))
      if l < num_layers - 1:
        inputs = wavefront.regroup(outputs, sizes)
        if mask_blocks:
          inputs = [b * m for b, m in zip(inputs, mask_blocks[l])]

    def grad(d_outputs, *d_states):
      d_cs, d_hs = d_states[:num_layers], d_states[num_layers:]
      d_c0s, d_h0s = [None] * num_layers, [None] * num_layers
      d_ks, d_bs = [None] * num_layers, [None] * num_layers
      d_out = wavefront.split_time(d_outputs, chunk)
      for l in reversed(range(num_layers)):
        d_out, d_c0s[l], d_h0s[l], d_ks[l], d_bs[l], pair = backward(
            plan, layer_inputs[l], ks[l], bs[l], layer_acts[l], d_out,
            d_cs[l], d_hs[l])
        low_rank_update.hand_out(factors, kernels[l], *pair)
        if mask_blocks and l > 0:
          d_out = [d * m for d, m in zip(d_out, mask_blocks[l - 1])]
      return ([wavefront.join_time(d_out)] + d_c0s + d_h0s + d_ks + d_bs +
              [None] * len(mask_blocks))

    return ((tf.stack(outputs),) + tuple(c for c, _ in finals) +
            tuple(h for _, h in finals)), grad

  results = stack(x, *([s.c for s in states] + [s.h for s in states] +
                       list(kernels) + list(biases) + masks))
  return results[0], [LSTMStateTuple(c, h) for c, h in
                      zip(results[1:1 + num_layers], results[1 + num_layers:])]


# cuDNN orders an LSTM's gates (input, forget, candidate, output); the
# canonical kernel orders them (input, candidate, forget, output).
_CUDNN_FROM_CANONICAL = (0, 2, 1, 3)


def canonical_to_cudnn(kernel, bias, input_size):
  """Converts canonical LSTM weights to cuDNN's canonical lists.

  Plain reshape/split/transpose/concat ops, so the conversion runs (and is
  tested) on any device.

  Args:
    kernel: `[input_size + hidden, 4 * hidden]`, gate blocks (i, j, f, o).
    bias: `[4 * hidden]`, same blocks.
    input_size: rows of the kernel that multiply the layer input.

  Returns:
    (weights, biases): 8 matrices `[hidden, input_size]` (input weights
    W_i, W_f, W_c, W_o) and `[hidden, hidden]` (recurrent weights R_i, R_f,
    R_c, R_o), and 8 vectors `[hidden]`: the input biases in cuDNN order, then
    four zero recurrent biases (cuDNN adds both; the model has one).
  """
  def reorder(blocks):
    return [blocks[k] for k in _CUDNN_FROM_CANONICAL]

  w_x = reorder(tf.split(kernel[:input_size], 4, axis=1))
  w_h = reorder(tf.split(kernel[input_size:], 4, axis=1))
  weights = [tf.transpose(w) for w in w_x + w_h]
  b = reorder(tf.split(bias, 4))
  return weights, b + [tf.zeros_like(b[0])] * 4


def cudnn_to_canonical(weights, biases):
  """Inverse of canonical_to_cudnn: returns (kernel, bias).

  The two cuDNN bias vectors of each gate are added into the one canonical
  bias, so converting there and back is exact.
  """
  def canonical(blocks):
    return [blocks[_CUDNN_FROM_CANONICAL.index(k)] for k in range(4)]

  w_x = canonical([tf.transpose(w) for w in weights[:4]])
  w_h = canonical([tf.transpose(w) for w in weights[4:]])
  kernel = tf.concat([tf.concat(w_x, 1), tf.concat(w_h, 1)], 0)
  bias = tf.concat(canonical([a + b for a, b in zip(biases[:4], biases[4:])]),
                   0)
  return kernel, bias


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
  weights, biases = canonical_to_cudnn(kernel, bias, input_size)

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


def _build_cudnn(plan, x, state, kernel, bias, factors):
  """CUDNN_RNN: one CudnnRNNV3 call, its registered gradient (dense)."""
  del plan, factors  # cuDNN makes its own products and gradients.
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
  return outputs, LSTMStateTuple(c[0], h[0])


# Each takes (plan, x, state, kernel, bias, factors).
_LAYER_BUILDERS = {
    plan_lib.LAYER: functools.partial(_layer, _basic_layer_forward),
    plan_lib.BLOCK_LSTM: functools.partial(_layer, _block_lstm_forward),
    plan_lib.CUDNN_RNN: _build_cudnn}


def lstm_layer(plan, x, state, kernel, bias):
  """Runs one LSTM layer on the path of its plan.

  Args:
    plan: a plan.Lstm of one layer (plan.lstm(..., num_layers=1, ...)).
    x: `[num_steps, batch, input]` time-major inputs.
    state: LSTMStateTuple of `[batch, hidden]` tensors.
    kernel: `[input + hidden, 4 * hidden]`, gate blocks (i, j, f, o).
    bias: `[4 * hidden]`.

  Returns:
    (outputs `[num_steps, batch, hidden]`, final LSTMStateTuple).
  """
  outputs, finals = lstm_stack(plan, x, [state], [kernel], [bias])
  return outputs, finals[0]


def lstm_stack(plan, x, states, kernels, biases, masks=None, factors=None):
  """Runs all LSTM layers, with dropout masks between them.

  Args:
    plan: the plan.Lstm of the model's call: each layer's path, the
      wavefront's chunk, the cell and the products.
    x: `[T, B, I]` time-major inputs of the first layer.
    states: one LSTMStateTuple of `[B, H]` tensors per layer.
    kernels, biases: one canonical kernel and bias per layer.
    masks: None, or one `[T, B, H]` dropout mask (0 or 1 / keep_prob) per
      layer but the last, applied to that layer's outputs.
    factors: None, or a dict that the backward pass fills with each
      kernel's gradient as factors, {kernel.ref(): LowRankGradient}.

  Returns:
    (outputs of the last layer `[T, B, H]`, list of final LSTMStateTuple).
  """
  if len(plan.paths) != len(kernels):
    raise ValueError("a plan of %d layers for %d" % (len(plan.paths),
                                                      len(kernels)))
  if plan.chunk:
    return basic_stack(plan, x, states, kernels, biases, masks, factors)
  finals = []
  for l, (state, kernel, bias) in enumerate(zip(states, kernels, biases)):
    x, state = _LAYER_BUILDERS[plan.paths[l]](plan, x, state, kernel, bias,
                                              factors)
    if masks and l < len(kernels) - 1:
      x = x * masks[l]
    finals.append(state)
  return x, finals
