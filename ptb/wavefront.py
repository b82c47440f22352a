"""BASIC over all layers as a wavefront of time chunks."""

import numpy as np
import tensorflow as tf

from ptb import lstm_backward
import util


def basic_stack(x, states, kernels, biases, masks, chunk,
                cell=lstm_backward.ops_cell):
  """BASIC's products over all layers in one custom gradient, as a wavefront.

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
    cell: the cell's elementwise part (lstm_backward.basic_forward's cell):
      BASIC's ops, or BLOCK's fused cell.

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
    mask_blocks = [lstm_backward.split_time(m, chunk)
                   for m in args[4 * num_layers:]]
    inputs = lstm_backward.split_time(x, chunk)
    layer_inputs, layer_acts, finals = [], [], []
    sizes = [b.shape[0] for b in inputs]
    for l in range(num_layers):
      layer_inputs.append(inputs)
      outputs, acts = lstm_backward.basic_forward(inputs, c0s[l], h0s[l], ks[l],
                                          bs[l], cell)
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
      d_out = lstm_backward.split_time(d_outputs, chunk)
      for l in reversed(range(num_layers)):
        d_out, d_c0s[l], d_h0s[l], d_ks[l], d_bs[l] = lstm_backward.backward(
            layer_inputs[l], ks[l], bs[l], layer_acts[l], d_out, d_cs[l],
            d_hs[l])
        if mask_blocks and l > 0:
          d_out = [d * m for d, m in zip(d_out, mask_blocks[l - 1])]
      return ([lstm_backward.join_time(d_out)] + d_c0s + d_h0s + d_ks + d_bs +
              [None] * len(mask_blocks))

    return ((tf.stack(outputs),) + tuple(c for c, _ in finals) +
            tuple(h for _, h in finals)), grad

  results = stack(x, *([s.c for s in states] + [s.h for s in states] +
                       list(kernels) + list(biases) + masks))
  return results[0], [util.LSTMStateTuple(c, h) for c, h in
                      zip(results[1:1 + num_layers], results[1 + num_layers:])]


def wavefront_chunk(hidden_size):
  """Steps per chunk of the BASIC wavefront (basic_stack) for a model.

  On two cores, chunks of 4 steps let the layers' recurrences overlap (small
  and medium train faster than one layer after the other). From hidden size
  1024 on, each layer's step products are bound by memory bandwidth: side
  by side they gain nothing, so the layers run one after the other.
  """
  return 4 if hidden_size < 1024 else None
