"""The softmax layer's cross-entropy, with a hand-written gradient."""

import tensorflow as tf

from ptb import kernels
from ptb import low_rank_update
from ptb import transposed_product


# Below this probability of the target word, -log(p) loses precision (and
# an underflow to zero would make it inf); the loss is then computed from
# the logits instead.
_MIN_TARGET_PROB = 1e-30


def softmax_loss(inputs, softmax_w, softmax_b, labels):
  """Cross-entropy of the softmax layer, with a hand-written gradient.

  Equal to tf.nn.sparse_softmax_cross_entropy_with_logits applied to
  `inputs @ softmax_w + softmax_b`, with less work on the `[N, V]` logits
  (N = batch x steps rows, V = vocabulary) besides the three matmuls. With
  the kernels (kernels.py: float32 on a CPU with AVX-512, or AVX2 with FMA)
  one op takes the logits from the matmul and, a row at a time while the
  row is in the L1 cache, adds the bias and writes softmax - onehot over
  them, with the loss (`softmax_loss_fused`). Otherwise the forward pass is
  one fused softmax (oneDNN) and the backward pass writes p - onehot into
  it in place (`softmax_loss_ops`). Both apply the per-row scale of the
  incoming gradient to the `[N, H]` side of the gradient's matmuls.

  Args:
    inputs: `[N, H]` outputs of the last layer.
    softmax_w: `[H, V]`; softmax_b: `[V]`.
    labels: int32 `[N]` target ids.

  Returns:
    float32 `[N]` losses. The logits and the softmax are float32 even with
    --use_fp16: exp of fp16 logits over a 10k vocabulary loses most of the
    precision that matters.
  """
  if kernels.cpu_kernels(inputs) is not None:
    return softmax_loss_fused(inputs, softmax_w, softmax_b, labels)
  return softmax_loss_ops(inputs, softmax_w, softmax_b, labels)


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
  d_inputs = transposed_product.matmul_transposed(d_logits, softmax_w) * scale
  scaled = tf.concat([inputs, tf.ones_like(scale)], 1) * scale  # [N, H+1]
  d_wb = tf.matmul(scaled, d_logits, transpose_a=True)          # [H+1, V]
  d_w, d_b = tf.split(d_wb, [inputs.shape[1], 1])
  # Either is applied from its factors where few rows make that cheaper
  # (low_rank_update.py); then nothing reads d_wb, and it is never formed.
  d_b = d_b[0]
  return (d_inputs,
          low_rank_update.record(d_w, scaled[:, :-1], d_logits),
          low_rank_update.record(d_b, scaled[:, -1:], d_logits))


@tf.custom_gradient
def softmax_loss_fused(inputs, softmax_w, softmax_b, labels):
  """softmax_loss with the kernels' SoftmaxCrossEntropy (float32 only)."""
  # No bias in the matmul: oneDNN adds it in a pass of its own over the
  # [N, V] output, and SoftmaxCrossEntropy adds it in its first pass.
  loss, d_logits = kernels.load().softmax_cross_entropy(
      tf.matmul(inputs, softmax_w), softmax_b, labels)

  def grad(d_loss):
    return _softmax_grads(inputs, softmax_w, d_logits, d_loss) + (None,)

  return loss, grad


@tf.custom_gradient
def softmax_loss_ops(inputs, softmax_w, softmax_b, labels):
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
