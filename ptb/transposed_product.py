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
The plan says which products are swapped (plan.SWAPPED, and its thresholds
swap_max_rows and swap_min_weight).
"""

import tensorflow as tf

from ptb import bfloat16


def matmul_transposed(a, w, swapped, products=bfloat16.FLOAT32):
  """a @ w^T, as (w @ a^T)^T if `swapped` (see above).

  Args:
    a: `[M, N]`.
    w: `[K, N]`.
    swapped: the plan's choice for this product (plan.SWAPPED).
    products: the products' dtype (bfloat16.FLOAT32 or BFLOAT16).

  Returns:
    `[M, K]`, float32 for BFLOAT16 products.
  """
  if swapped:
    return tf.transpose(bfloat16.matmul(w, a, products, transpose_b=True))
  return bfloat16.matmul(a, w, products, transpose_b=True)
