"""Products of few rows with a transposed weight: a @ w^T as (w @ a^T)^T.

The backward pass multiplies gradients by transposed weights: the input
gradient of a layer is d_y @ w^T. With few rows in d_y (the how-to's
LargeConfig edited to 2 steps: 40 rows against a `[1000, 10000]` softmax
weight) and a weight that streams from memory, both oneDNN and Eigen run
that product with transpose_b far below the speed of x @ w on the same
shapes. Swapped, w @ d_y^T reads the large weight as the left operand in
its own layout, and only the small result is transposed back. The two give
the same sums in another order (float32 rounding apart).

Where the weight fits in the caches (small's), or the rows are many (every
default config's softmax layer: 400 or 700), the plain product is as fast
or faster and is kept; so it is on GPUs, whose libraries need no such help.
"""

import tensorflow as tf

# Rows up to which the swapped product is used; the weight must also hold
# MIN_WEIGHT elements (4 MiB in float32, beyond a core's L2). On the Zen 4
# (docs/performance.md) the swap was faster from 20 to 128 rows, slower at 400.
MAX_ROWS = 128
MIN_WEIGHT = 1 << 20


def swapped(a, w):
  """Whether matmul_transposed(a, w) swaps the product's operands."""
  rows, size = a.shape[0], w.shape.num_elements()
  return (rows is not None and size is not None and rows <= MAX_ROWS and
          size >= MIN_WEIGHT and "GPU" not in a.device.upper())


def matmul_transposed(a, w):
  """a @ w^T, swapped as (w @ a^T)^T where that is faster (see above).

  Args:
    a: `[M, N]`.
    w: `[K, N]`.

  Returns:
    `[M, K]`.
  """
  if swapped(a, w):
    return tf.transpose(tf.matmul(w, a, transpose_b=True))
  return tf.matmul(a, w, transpose_b=True)
