"""Gradients of few rows, carried as their factors and applied unformed.

Every weight matrix of the model gets its gradient from one product over
the rows of a step (batch x steps): x^T @ g, with x `[M, K]` (the layer's
inputs) and g `[M, N]` (the gradient at its outputs). When M is small
against K and N (the how-to's LargeConfig edited to 2 steps: 40 rows
against a `[2000, 4000]` kernel), forming that gradient costs more memory
traffic than arithmetic: it is written, read for the global norm, read
again for the update, and the weights are read and written. Instead:

- the squared norm of x^T g is sum((x x^T) * (g g^T)), from two `[M, M]`
  Gram matrices, without the product;
- the update w -= lr * x^T g is one pass over w (the kernels'
  ApplyOuterProduct), the product summed in registers.

Where the plan says so (plan.FACTORS), the backward passes of the LSTM and
the softmax layer hand each such gradient out as a LowRankGradient, a named
pair, into a dict that their caller gives them; the model puts it in place
of the dense gradient, and the towers' average (util.average_gradients)
and the optimizer (util.ClippedGradientDescent) take it as such. The dense
gradient that tf.gradients returns beside it is then read by nobody, and
the graph prunes its matmul.
"""

import collections

import tensorflow as tf

from ptb import kernels


class LowRankGradient(collections.namedtuple("LowRankGradient", ("x", "g"))):
  """A weight's gradient as the product x^T @ g, not formed.

  Attributes:
    x: `[M, K]`; K = 1 for a bias.
    g: `[M, N]`.
  The gradient is x^T @ g, `[K, N]`, or its one row `[N]` for a bias.
  """


def hand_out(factors, weight, x, g):
  """Puts x^T @ g into `factors` as `weight`'s LowRankGradient, if asked.

  Args:
    factors: None, or the caller's dict {weight.ref(): LowRankGradient}.
    weight: the weight (a variable or tensor) whose gradient it is.
    x, g: the factors, `[M, K]` and `[M, N]`.
  """
  if factors is not None:
    factors[weight.ref()] = LowRankGradient(x, g)


def with_factors(gradients, weights, factors):
  """Each weight's gradient, its LowRankGradient where `factors` has one.

  Args:
    gradients: tf.gradients' results, in the order of `weights`.
    weights: the variables.
    factors: None, or {weight.ref(): LowRankGradient} from the backward pass.
  """
  if not factors:
    return list(gradients)
  return [factors.get(w.ref(), g) for g, w in zip(gradients, weights)]


def average(gradients):
  """The average of several towers' LowRankGradients, itself one.

  The sum over towers of x_k^T g_k is the product of their rows
  concatenated, as the embedding's rows are: (concat x)^T (concat g).
  """
  scale = 1.0 / len(gradients)
  return LowRankGradient(tf.concat([d.x for d in gradients], 0) * scale,
                         tf.concat([d.g for d in gradients], 0))


def dense(gradient, shape):
  """The gradient x^T @ g formed, in `shape` (`[K, N]` or a bias's `[N]`)."""
  return tf.reshape(tf.matmul(gradient.x, gradient.g, transpose_a=True),
                    shape)


def squared_norm(gradient):
  """||x^T @ g||^2 from the Gram matrices: sum((x x^T) * (g g^T))."""
  x, g = gradient
  return tf.reduce_sum(tf.matmul(x, x, transpose_b=True) *
                       tf.matmul(g, g, transpose_b=True))


def apply(var, gradient, learning_rate, isa):
  """The op that does var -= learning_rate * x^T @ g in place.

  Args:
    var: a float32 resource variable on the CPU.
    gradient: its LowRankGradient.
    learning_rate: a scalar tensor.
    isa: the kernels' width (the plan's).
  """
  return kernels.load().apply_outer_product(
      var.handle, gradient.x, gradient.g, -tf.cast(learning_rate, tf.float32),
      isa=isa)
