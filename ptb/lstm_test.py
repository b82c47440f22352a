"""Tests of the LSTM layer in its modes, the backward pass and the wavefront."""

import numpy as np
import tensorflow as tf

from ptb import lstm
from ptb import plan as plan_lib
from ptb import recurrent_product
from ptb.config import BASIC, BLOCK
from ptb.state import LSTMStateTuple
from ptb.testing import reference_lstm
from ptb.testing import wavefront_limits


# BlockLSTM with TensorFlow's registered gradient (BlockLSTMGrad): an
# independent reference for the hand-written backward pass of both modes.
REGISTERED = "block_lstm_registered_gradient"
# BLOCK where the kernels' fused cell is not there (GPUs, fp16, no
# compiler): tf.raw_ops.BlockLSTM's forward. BLOCK itself, on this CPU,
# runs the fused cell where the kernels load.
BLOCK_OP = "block_lstm_op"


# One layer at a time (plan.LAYER), whatever its size.
LAYER_BY_LAYER = wavefront_limits(None, 0)


def layer_plan(rnn_mode, x, kernel, limits=LAYER_BY_LAYER, num_layers=1):
  """The plan of `rnn_mode`'s layers on inputs like x `[T, B, I]`, here.

  BLOCK_OP is BLOCK without the kernels; BLOCK has them where they load.
  """
  steps, batch, _ = x.shape
  isa = plan_lib.offered().isa if rnn_mode == BLOCK else None
  return plan_lib.lstm(BLOCK if rnn_mode == BLOCK_OP else rnn_mode,
                       num_layers, kernel.shape[1] // 4, batch, steps, isa,
                       limits=limits)


def layer_outputs(rnn_mode, inputs, dtype=tf.float32):
  """One LSTM layer's outputs and gradients for numpy inputs."""
  x, c0, h0, kernel, bias, dy, dc, dh = (tf.constant(v, dtype) for v in inputs)
  if rnn_mode == REGISTERED:
    block = lstm.block_lstm(x, c0, h0, kernel, bias)
    outputs, state = block[6], LSTMStateTuple(block[1][-1], block[6][-1])
  else:
    outputs, state = lstm.lstm_layer(
        layer_plan(rnn_mode, x, kernel), x, LSTMStateTuple(c0, h0), kernel,
        bias)
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


class LstmLayerTest(tf.test.TestCase):

  def testModesMatchNumpyReference(self):
    inputs = random_layer_inputs()
    want = reference_lstm(*inputs[:5])
    for mode in (BASIC, BLOCK, BLOCK_OP):
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        got = sess.run(layer_outputs(mode, inputs)[:3])
      for g, w in zip(got, want):
        self.assertAllClose(g, w, rtol=1e-5, atol=1e-6, msg=mode)

  def testBasicAndBlockEqualBlockLstmWithItsRegisteredGradient(self):
    inputs = random_layer_inputs()
    results = {}
    for mode in (REGISTERED, BASIC, BLOCK, BLOCK_OP):
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        results[mode] = sess.run(layer_outputs(mode, inputs))
    names = ["outputs", "c", "h", "d_x", "d_c0", "d_h0", "d_kernel", "d_bias"]
    for mode in (BASIC, BLOCK, BLOCK_OP):
      for name, got, want in zip(names, results[mode], results[REGISTERED]):
        self.assertAllClose(got, want, rtol=1e-5, atol=1e-6,
                            msg="%s %s" % (mode, name))

  def testGradientsAgreeWithNumericalGradient(self):
    # Float64 numerics in the reference, float32 in the ops: the numerical
    # gradient is taken in float32 with a step that float32 resolves.
    inputs = random_layer_inputs(num_steps=3, batch=2, input_size=3, hidden=2)
    for mode in (BLOCK, BASIC):
      with tf.Graph().as_default(), tf.compat.v1.Session():
        x, c0, h0, kernel, bias = (tf.constant(v, tf.float32)
                                   for v in inputs[:5])
        dy = tf.constant(inputs[5], tf.float32)
        outputs, state = lstm.lstm_layer(
            layer_plan(mode, x, kernel), x, LSTMStateTuple(c0, h0), kernel,
            bias)
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
    Below kernel_min_steps steps the products take w_h as it is: no copy.
    """
    inputs = random_layer_inputs(input_size=4, hidden=5)
    for mode, min_steps, want in ((BASIC, 0, [[20, 5]]), (BLOCK, 0, [[20, 5]]),
                                  (BASIC, 10**9, []), (BLOCK, 10**9, [])):
      limits = LAYER_BY_LAYER._replace(kernel_min_steps=min_steps)
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        feeds = [tf.compat.v1.placeholder(tf.float32, v.shape)
                 for v in inputs]
        x, c0, h0, kernel, bias, dy, _, _ = feeds
        plan = layer_plan(mode, x, kernel, limits)
        self.assertEqual(plan.backward, plan_lib.TRANSPOSED if min_steps == 0
                         else plan_lib.PLAIN)
        outputs, _ = lstm.lstm_layer(
            plan, x, LSTMStateTuple(c0, h0), kernel, bias)
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
      self.assertEqual(transposed, want, msg=(mode, min_steps))   # [4H, H]
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
    w_x, w_h = recurrent_product.split_kernel(kernel, 650)
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
      states = [LSTMStateTuple(tf.constant(c), tf.constant(h))
                for c, h in states]
      kernels = [tf.constant(k) for k in kernels]
      biases = [tf.constant(b) for b in biases]
      limits = wavefront_limits(chunk, x.shape[2])
      outputs, finals = lstm.lstm_stack(
          layer_plan(rnn_mode, x, kernels[0], limits, len(kernels)), x,
          states, kernels, biases, [tf.constant(m) for m in masks])
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
    want = self._run(BLOCK, None, values)
    # Chunks of 2 steps leave a last chunk of 1; None is one chunk.
    for chunk in (2, None, 1):
      got = self._run(BASIC, chunk, values)
      self.assertEqual(len(got), len(want))
      for k, (g, w) in enumerate(zip(got, want)):
        self.assertAllClose(g, w, rtol=1e-5, atol=1e-6,
                            msg="chunk %s, result %d" % (chunk, k))


if __name__ == "__main__":
  tf.test.main()
