"""The recurrent weights' products, forward and backward, on every path.

An LSTM kernel `[I + H, 4H]` splits into its input rows w_x and recurrent
rows w_h; every time step multiplies h by w_h (forward) and d_gates by
w_h^T (backward). They run on tf.matmul, or on the kernels' panels (w_h
packed once per call: float32, or bfloat16 pairs on VDPBF16PS), as the
plan says.
"""

import tensorflow as tf

from ptb import bfloat16
from ptb import kernels as kernels_lib
from ptb import plan as plan_lib
from ptb import transposed_product


def forward(plan, w_h):
  """The forward step's product: a function (h, x) -> h @ w_h + x.

  Args:
    plan: the plan.Lstm (its forward product and the products' dtype).
    w_h: `[H, 4H]` recurrent weights, already the products' operand.

  Returns:
    A function of h `[B, H]` and x `[B, 4H]` returning `[B, 4H]`.
  """
  if plan.forward != plan_lib.KERNELS:
    return lambda h, x: bfloat16.matmul(h, w_h, plan.products) + x
  library = kernels_lib.load()
  if plan.products == bfloat16.BFLOAT16:
    panels = library.pack_panels_bf16(w_h, transpose=False)
    return lambda h, x: library.panel_mat_mul_bf16(h, panels, x)
  panels = library.pack_panels(w_h, transpose=False)
  return lambda h, x: library.panel_mat_mul(h, panels, x, isa=plan.isa)



def backward(plan, w_h, batch):
  """The backward step's product: a function d_gates -> d_gates @ w_h^T.

  Args:
    plan: the plan.Lstm (its backward product and the products' dtype).
    w_h: `[H, 4H]` recurrent weights, already the products' operand.
    batch: B.

  Returns:
    A function of d_gates `[B, 4H]` returning `[B, H]`.
  """
  if plan.backward == plan_lib.KERNELS:
    library = kernels_lib.load()
    zeros = tf.zeros([batch, w_h.shape[0]], tf.float32)
    if plan.products == bfloat16.BFLOAT16:
      panels = library.pack_panels_bf16(w_h, transpose=True)
      return lambda d_gates: library.panel_mat_mul_bf16(d_gates, panels,
                                                        zeros)
    panels = library.pack_panels(w_h, transpose=True)
    return lambda d_gates: library.panel_mat_mul(d_gates, panels, zeros,
                                                 isa=plan.isa)
  if plan.backward != plan_lib.TRANSPOSED:
    # Too few products to pay for a transposed copy.
    return lambda d_gates: transposed_product.matmul_transposed(
        d_gates, w_h, plan.backward == plan_lib.SWAPPED, plan.products)
  # w_h transposed once, so that the per-step product needs no transpose_b
  # (faster per step). Grappler would fold a Transpose that feeds a MatMul
  # back into transpose_b=True; the Snapshot between them (it forwards its
  # input's buffer, no copy) keeps it. Only w_h: a transposed copy of the
  # whole kernel would stay alive through the step and cost memory.
  w_h_t = tf.raw_ops.Snapshot(input=tf.transpose(w_h))
  return lambda d_gates: bfloat16.matmul(d_gates, w_h_t, plan.products)


def split_kernel(kernel, input_size, products=bfloat16.FLOAT32,
                 recurrent_products=None):
  """A kernel's input rows `[I, 4H]` and recurrent rows `[H, 4H]`, operands
  of `products` (bfloat16: cast once per pass, for every step's product).

  `recurrent_products` (default `products`) is the recurrent rows' dtype:
  float32 where the kernels' bfloat16 panels round them themselves.

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
  return (bfloat16.operand(tf.reshape(w_x, [-1, cols]), products),
          bfloat16.operand(tf.reshape(w_h, [-1, cols]),
                           recurrent_products or products))


def dtype(plan):
  """The dtype of w_h's operand: float32 for the bfloat16 panels to round."""
  return (bfloat16.FLOAT32 if plan.forward == plan_lib.KERNELS
          else plan.products)
