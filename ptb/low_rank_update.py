"""Gradients of few rows, applied without being written out.

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

The producers of such gradients (the LSTM's backward pass, the softmax
layer) `record` their factors; the optimizer (util.ClippedGradientDescent)
asks `factors` for each gradient it applies. A gradient that nobody reads
densely is then never computed: the graph prunes its matmul. Towers and
cluster workers add gradients up first: those sums have no recorded
factors and take the dense path.
"""

import weakref

import tensorflow as tf

from ptb import kernels

# Rows up to which the update runs from the factors. Beyond, the dense
# matmul's blocking beats the kernel's register tiles and the traffic saved
# matters less (every default config has 400 or 700 rows).
MAX_ROWS = 128

# graph -> {tensor reference: (x, g)}
_recorded = weakref.WeakKeyDictionary()


def record(gradient, x, g):
  """Records that `gradient` equals reshape(x^T @ g, gradient's shape).

  Args:
    gradient: the dense gradient, `[K, N]`, or `[N]` with K = 1.
    x: `[M, K]`.
    g: `[M, N]`.

  Returns:
    gradient, for chaining.
  """
  _recorded.setdefault(gradient.graph, {})[gradient.ref()] = (x, g)
  return gradient


def factors(gradient, var):
  """(x, g) with gradient = x^T @ g, if `var` can be updated from them.

  Args:
    gradient: a gradient tensor (or IndexedSlices) of `var`.
    var: the variable it updates.

  Returns:
    (x, g), or None: not recorded, more than MAX_ROWS rows, not float32,
    not on the CPU, or no kernels here.
  """
  if not tf.is_tensor(gradient) or isinstance(gradient, tf.IndexedSlices):
    return None
  found = _recorded.get(gradient.graph, {}).get(gradient.ref())
  if found is None or (found[0].shape[0] or MAX_ROWS + 1) > MAX_ROWS:
    return None
  if kernels.cpu_kernels(var) is None:
    return None
  return found


def squared_norm(x, g):
  """||x^T @ g||^2 from the Gram matrices: sum((x x^T) * (g g^T))."""
  return tf.reduce_sum(tf.matmul(x, x, transpose_b=True) *
                       tf.matmul(g, g, transpose_b=True))


def apply(var, x, g, learning_rate):
  """The op that does var -= learning_rate * x^T @ g in place."""
  return kernels.load().apply_outer_product(
      var.handle, x, g, -tf.cast(learning_rate, tf.float32))
