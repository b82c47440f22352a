"""The BASIC cell's forward pass and the backward pass of BASIC and BLOCK.

All LSTM code takes time-major inputs `[T, B, I]`, an initial state `(c, h)`
of `[B, H]` each, and the canonical weights: kernel `[I + H, 4H]` with gate
blocks (input, candidate, forget, output) and bias `[4H]`.

The forward pass keeps every step's activations in the layout of
tf.raw_ops.BlockLSTM's outputs, so that one hand-written backward pass
serves BASIC and BLOCK: the recurrence step by step with the fused
LSTMBlockCellGrad, then the weight gradient as ONE matmul over all steps
(BlockLSTMGrad does a small one per step, which is slow on the CPU). Inputs
may come as a list of time blocks, so that the wavefront (wavefront.py) can
start a layer on a block before the whole sequence is there.
"""

import tensorflow as tf

from ptb import kernels
from ptb import low_rank_update


def split_time(x, chunk=None):
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


def join_time(blocks):
  """The `[T, ...]` tensor of a list of time blocks."""
  return blocks[0] if len(blocks) == 1 else tf.concat(blocks, 0)


# The kernels (ptb/kernels.py) do the per-step recurrent products from this
# hidden size and batch on. Below, the products fit in the L2 cache and
# oneDNN is as fast, so packing the weights is pure cost (small, hidden 200,
# trained 2-5 % slower with them); with batch 1 (the test pass) the packing
# would be repeated at every call for products of one row. Packing reads
# and writes the weights once per pass, so it pays only over enough steps.
KERNEL_MIN_HIDDEN = 512
KERNEL_MIN_BATCH = 8
KERNEL_MIN_STEPS = 8


def recurrent_kernels(like, hidden, steps):
  """The kernels' op library for a layer, or None to use tf.matmul.

  Args:
    like: a `[B, ...]` tensor of the layer, built on its tower's device.
    hidden: the layer's hidden size.
    steps: the products of one pass (time steps) that share the packing.
  """
  if (hidden < KERNEL_MIN_HIDDEN or (like.shape[0] or 0) < KERNEL_MIN_BATCH
      or steps < KERNEL_MIN_STEPS):
    return None
  return kernels.cpu_kernels(like)


def _forward_product(w_h, like, steps):
  """The forward step's product: a function (h, x) -> h @ w_h + x.

  Args:
    w_h: `[H, 4H]` recurrent weights.
    like: a `[B, ...]` tensor of the layer, on its tower's device.
    steps: the time steps of the pass.

  Returns:
    A function of h `[B, H]` and x `[B, 4H]` returning `[B, 4H]`.
  """
  library = recurrent_kernels(like, w_h.shape[0], steps)
  if library is None:
    return lambda h, x: tf.matmul(h, w_h) + x
  panels = library.pack_panels(w_h, transpose=False)
  return lambda h, x: library.panel_mat_mul(h, panels, x)


def _backward_product(w_h, like, steps):
  """The backward step's product: a function d_gates -> d_gates @ w_h^T.

  Args:
    w_h: `[H, 4H]` recurrent weights.
    like: a `[B, ...]` tensor of the layer, on its tower's device.
    steps: the time steps of the pass.

  Returns:
    A function of d_gates `[B, 4H]` returning `[B, H]`.
  """
  library = recurrent_kernels(like, w_h.shape[0], steps)
  if library is not None:
    panels = library.pack_panels(w_h, transpose=True)
    zeros = tf.zeros([like.shape[0], w_h.shape[0]], w_h.dtype)
    return lambda d_gates: library.panel_mat_mul(d_gates, panels, zeros)
  if steps < KERNEL_MIN_STEPS:
    # Too few products to pay for a transposed copy either.
    return lambda d_gates: tf.matmul(d_gates, w_h, transpose_b=True)
  # w_h transposed once, so that the per-step product needs no transpose_b
  # (faster per step). Grappler would fold a Transpose that feeds a MatMul
  # back into transpose_b=True; the Snapshot between them (it forwards its
  # input's buffer, no copy) keeps it. Only w_h: a transposed copy of the
  # whole kernel would stay alive through the step and cost memory.
  w_h_t = tf.raw_ops.Snapshot(input=tf.transpose(w_h))
  return lambda d_gates: tf.matmul(d_gates, w_h_t)


def split_kernel(kernel, input_size):
  """The input rows `[I, 4H]` and the recurrent rows `[H, 4H]` of a kernel.

  Split as one flat vector, so that the pieces are views of the kernel:
  TensorFlow splits along dim 0 without a copy when each piece starts on a
  64-byte boundary, but for a 2-D tensor it checks that through the row
  size alone, and rows of 2,600 floats (medium) are not a multiple of 16
  floats although the pieces do start on a boundary. In 1-D the pieces' own
  offsets are checked.
  """
  rows, cols = kernel.shape
  w_x, w_h = tf.split(tf.reshape(kernel, [-1]),
                      [input_size * cols, (rows - input_size) * cols])
  return (tf.reshape(w_x, [input_size, cols]),
          tf.reshape(w_h, [rows - input_size, cols]))


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


def basic_forward(x, c, h, kernel, bias, cell=ops_cell):
  """Forward pass from products and a cell, keeping what backward needs.

  Args:
    x: `[T, B, I]` inputs, or a list of time blocks `[C, B, I]`: the
      steps of a block wait only for that block's inputs.
    c, h: `[B, H]` initial state.
    kernel, bias: the canonical weights.
    cell: the elementwise part, as ops_cell: ops_cell (BASIC) or the
      kernels' fused lstm_cell (BLOCK on the CPU).

  Returns:
    (outputs: a list of T `[B, H]` tensors, per-step activations: a dict of
    lists of T `[B, H]` tensors under "i", "cs", "f", "o", "ci", "co" as
    BlockLSTM names them, and "c_prev", "h_prev").
  """
  blocks = split_time(x)
  input_size = blocks[0].shape[2]
  w_x, w_h = split_kernel(kernel, input_size)
  acts = {k: [] for k in ("i", "cs", "f", "o", "ci", "co", "c_prev",
                          "h_prev")}
  outputs = []
  product = _forward_product(w_h, h, sum(b.shape[0] for b in blocks))
  for block in blocks:
    # One large matmul for the input projection of a block of steps, with
    # the bias; only the recurrent product h @ w_h has to wait for the
    # previous step. The bias is not added per step: Grappler would fuse
    # MatMul, BiasAdd and Add into one oneDNN op that first copies its
    # addend into the output, a reorder at every step.
    for x_t in tf.unstack(tf.nn.bias_add(tf.tensordot(block, w_x, 1), bias)):
      acts["c_prev"].append(c)
      acts["h_prev"].append(h)
      step = cell(product(h, x_t), c)
      for k, v in zip(("i", "cs", "f", "o", "ci", "co"), step):
        acts[k].append(v)
      c, h = step[1], step[6]
      outputs.append(h)
  return outputs, acts


def backward(x, kernel, bias, acts, d_outputs, d_c, d_h):
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
    acts: per-step activations, as basic_forward returns them.
    d_outputs: None, `[T, B, H]`, or a list of blocks like x's.
    d_c, d_h: `[B, H]` or None.

  Returns:
    (d_x: a list of blocks `[C, B, I]` like x's, d_c0, d_h0, d_kernel,
    d_bias).
  """
  blocks = split_time(x)
  sizes = [b.shape[0] for b in blocks]
  input_size = blocks[0].shape[2]
  hidden = kernel.shape[1] // 4
  w_x, w_h = split_kernel(kernel, input_size)
  product = _backward_product(w_h, acts["cs"][-1], sum(sizes))
  zeros_h = tf.zeros([hidden], kernel.dtype)
  d_c = tf.zeros_like(acts["cs"][-1]) if d_c is None else d_c
  d_h = tf.zeros_like(acts["cs"][-1]) if d_h is None else d_h
  if d_outputs is None:
    d_out_blocks = [None] * len(blocks)
  elif tf.is_tensor(d_outputs) and len(blocks) > 1:
    d_out_blocks = tf.split(d_outputs, sizes)
  else:
    d_out_blocks = split_time(d_outputs)
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
  flat_g = tf.reshape(join_time(gate_blocks), [-1, 4 * hidden])  # [T*B, 4H]
  xh = tf.concat([join_time(blocks), tf.stack(acts["h_prev"])], 2)  # [T,B,I+H]
  flat_xh = tf.reshape(xh, [-1, input_size + hidden])
  d_kernel = low_rank_update.record(
      tf.matmul(flat_xh, flat_g, transpose_a=True), flat_xh, flat_g)
  d_bias = tf.reduce_sum(flat_g, 0)
  return d_x, d_c, d_h, d_kernel, d_bias
