"""The softmax layer's cross-entropy, with a hand-written gradient.

Either way, one step of the forward pass (`_cross_entropy_kernel` or
`_cross_entropy_ops`) takes the logits' product and returns the loss and
d_logits = softmax - onehot, the gradient that the backward pass needs:
every gradient taken of the loss reads that one d_logits.
"""

import tensorflow as tf

from ptb import bfloat16
from ptb import kernels
from ptb import low_rank_update
from ptb import plan as plan_lib
from ptb import transposed_product


# Below this probability of the target word, -log(p) loses precision (and
# an underflow to zero would make it inf); the loss is then computed from
# the logits instead.
_MIN_TARGET_PROB = 1e-30


def softmax_loss(plan, inputs, softmax_w, softmax_b, labels, factors=None):
  """Cross-entropy of the softmax layer, with a hand-written gradient.

  Equal to tf.nn.sparse_softmax_cross_entropy_with_logits applied to
  `inputs @ softmax_w + softmax_b`, with less work on the `[N, V]` logits
  (N = batch x steps rows, V = vocabulary) besides the three matmuls. With
  the kernel (plan.KERNEL) one op takes the logits from the matmul and, a
  row at a time while the row is in the L1 cache, adds the bias and writes
  softmax - onehot over them, with the loss. With TensorFlow's ops
  (plan.OPS) the forward pass is one fused softmax (oneDNN) and p - onehot
  is written into it in place. Both apply the per-row scale of the incoming
  gradient to the `[N, H]` side of the gradient's matmuls.

  Args:
    plan: the plan.Softmax: the loss's path, whether d_inputs' product is
      swapped, the kernel's width.
    inputs: `[N, H]` outputs of the last layer.
    softmax_w: `[H, V]`; softmax_b: `[V]`.
    labels: int32 `[N]` target ids.
    factors: None, or a dict that the backward pass fills with softmax_w's
      and softmax_b's gradients as factors, {weight.ref(): LowRankGradient}.

  Returns:
    float32 `[N]` losses. The logits and the softmax are float32 even with
    --use_fp16: exp of fp16 logits over a 10k vocabulary loses most of the
    precision that matters.
  """
  cross_entropy = (_cross_entropy_kernel if plan.loss == plan_lib.KERNEL
                   else _cross_entropy_ops)

  @tf.custom_gradient
  def loss_and_gradient(inputs, weight, bias, labels):
    # No bias in the matmul: the kernel adds it in its first pass (oneDNN
    # would in a pass of its own over the [N, V] output).
    loss, d_logits = cross_entropy(
        plan, bfloat16.matmul(inputs, weight, plan.products), bias, labels)

    def grad(d_loss):
      d_inputs, d_w, d_b = _softmax_grads(
          plan, inputs, weight, d_logits, d_loss, softmax_w, softmax_b,
          factors)
      return d_inputs, d_w, d_b, None

    return loss, grad

  return loss_and_gradient(inputs, softmax_w, softmax_b, labels)


def _cross_entropy_kernel(plan, product, bias, labels):
  """(loss, d_logits) from the kernels' SoftmaxCrossEntropy (float32)."""
  return kernels.load().softmax_cross_entropy(product, bias, labels,
                                              isa=plan.isa)


def _cross_entropy_ops(plan, product, bias, labels):
  """(loss `[N]` float32, d_logits `[N, V]` in product's dtype), from ops.

  The probabilities are private to this function: their only readers are
  the target's gather and the one InplaceSub below, which writes
  p - onehot into their buffer without a copy (a scatter copies all
  N x V values), after the gather: hence the control dependency on the
  loss. InplaceSub writes whoever else holds the buffer, so the function
  returns d_logits, never the probabilities, and builds it once, in the
  forward pass: every gradient taken of the loss reads that one d_logits,
  and none writes again.
  """
  del plan  # TensorFlow's ops have nothing to choose.
  logits = tf.cast(product + bias, tf.float32)
  probs = tf.nn.softmax(logits)
  index = tf.stack([tf.range(tf.shape(labels)[0]), labels], axis=1)
  target = tf.gather_nd(probs, index)

  def exact():
    return (tf.reduce_logsumexp(logits, axis=1) -
            tf.gather_nd(logits, index))

  loss = tf.cond(tf.reduce_min(target) >= _MIN_TARGET_PROB,
                 lambda: -tf.math.log(target), exact)
  num_rows, vocab = tf.shape(logits)[0], probs.shape[1]
  with tf.control_dependencies([loss]):
    flat = tf.raw_ops.InplaceSub(
        x=tf.reshape(probs, [-1, 1]), i=tf.range(num_rows) * vocab + labels,
        v=tf.ones([num_rows, 1], probs.dtype))
  return loss, tf.cast(tf.reshape(flat, [num_rows, vocab]), product.dtype)


def _softmax_grads(plan, inputs, weight, d_logits, d_loss, softmax_w,
                   softmax_b, factors):
  """The softmax layer's gradients from d_logits = softmax - onehot.

  diag(d_loss) scales the narrow `[N, H]` side of each product instead of
  the `[N, V]` one, and the bias gradient is one more row of the
  weight-gradient product (a separate column sum is a slow pass).

  Args:
    plan: the plan.Softmax.
    inputs: `[N, H]`; weight: `[H, V]`, softmax_w as a tensor.
    d_logits: `[N, V]` softmax - onehot, in the dtype of inputs.
    d_loss: float32 `[N]`, the gradient of the losses.
    softmax_w, softmax_b: the weights, as the caller's `factors` names them.
    factors: None, or the caller's dict for their LowRankGradients.

  Returns:
    (d_inputs `[N, H]`, d_w `[H, V]`, d_b `[V]`).
  """
  scale = tf.cast(d_loss, inputs.dtype)[:, None]
  # Both products read d_logits: cast once for bfloat16 products.
  d_product = bfloat16.operand(d_logits, plan.products)
  d_inputs = transposed_product.matmul_transposed(
      d_product, weight,
      plan.input_gradient == plan_lib.SWAPPED, plan.products) * scale
  scaled = tf.concat([inputs, tf.ones_like(scale)], 1) * scale  # [N, H+1]
  d_wb = bfloat16.matmul(scaled, d_product, plan.products,
                         transpose_a=True, isa=plan.isa)        # [H+1, V]
  d_w, d_b = tf.split(d_wb, [inputs.shape[1], 1])
  # Where the plan updates them from their factors, nothing reads d_wb,
  # and it is never formed.
  low_rank_update.hand_out(factors, softmax_w, scaled[:, :-1], d_logits)
  low_rank_update.hand_out(factors, softmax_b, scaled[:, -1:], d_logits)
  return d_inputs, d_w, d_b[0]
