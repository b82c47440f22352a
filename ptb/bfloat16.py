"""bfloat16 products (--use_bf16): the casts, and whether a CPU computes them.

With --use_bf16 every matrix product of the model (the LSTM's input and
recurrent products and the softmax layer's, forward and backward) takes its
operands in bfloat16 and accumulates in float32 (oneDNN, or the GPU's
library); its output is cast back to float32 at once. Everything else stays
float32: the variables (master weights), the update, the gradient norm and
clipping, the cell state, the softmax and the loss. A bfloat16 product
rounds its operands to 8 bits of mantissa and its result once, not its
partial sums: the loss and the gradients agree with float32's to about 1 %.

A weight is cast outside the time loop, once for the forward pass and once
for the backward pass of a session call, so that the recurrent product of
every step reads half the bytes; the update writes only the float32 master.
The plan (ptb/plan.py) carries the products' dtype (`products`, FLOAT32 or
BFLOAT16) and the builders pass it here.

The CPUs this benchmark measures compute bfloat16 on AVX512_BF16 (VDPBF16PS:
AMD Zen 4 and later, Intel since Cooper Lake) or on AMX tiles (Intel Xeon
since Sapphire Rapids). Without either, oneDNN converts and multiplies in
float32 and the run is slower than in float32: `check` refuses it unless
forced (--force_bf16, for tests).
"""

import tensorflow as tf

from ptb import kernels
from ptb.config import CUDNN
from ptb.errors import UserError

FLOAT32 = "float32"
BFLOAT16 = "bfloat16"
CPUINFO = "/proc/cpuinfo"


def products(use_bf16):
  """The products' dtype name of a run: BFLOAT16 with --use_bf16."""
  return BFLOAT16 if use_bf16 else FLOAT32


def operand(x, dtype_name):
  """`x` as a product's operand: cast to bfloat16 for BFLOAT16 products."""
  if dtype_name == BFLOAT16 and x.dtype != tf.bfloat16:
    return tf.cast(x, tf.bfloat16)
  return x


def _result(product, dtype_name):
  """A product's output, back in float32 for BFLOAT16 products."""
  return tf.cast(product, tf.float32) if dtype_name == BFLOAT16 else product


def matmul(a, b, dtype_name, transpose_a=False, transpose_b=False,
           isa=None):
  """a @ b in the products' dtype; float32 out for BFLOAT16.

  Args:
    a: `[M, K]` (`[K, M]` with transpose_a).
    b: `[K, N]` (`[N, K]` with transpose_b).
    dtype_name: FLOAT32 (tf.matmul as it is) or BFLOAT16.
    transpose_a, transpose_b: as tf.matmul's.
    isa: the kernels' width where the plan runs them, else None. With
      BFLOAT16, transpose_a and the kernels, a float32 `a` is transposed
      and rounded in one pass by their TransposeBf16, and oneDNN reads it
      plain: its bfloat16 GEMM re-lays a transposed operand in every call,
      more slowly (a weight gradient `x^T @ g`, K = batch x steps), and
      grappler folds a tf.transpose back into transpose_a.

  Returns:
    `[M, N]`.
  """
  if (dtype_name == BFLOAT16 and transpose_a and isa is not None and
      a.dtype == tf.float32):
    a, transpose_a = kernels.load().transpose_bf16(a), False
  return _result(tf.matmul(operand(a, dtype_name), operand(b, dtype_name),
                           transpose_a=transpose_a, transpose_b=transpose_b),
                 dtype_name)


def tensordot(x, w, dtype_name):
  """x @ w over x's last axis: `[..., K]` times `[K, N]` gives `[..., N]`."""
  return _result(tf.tensordot(operand(x, dtype_name), operand(w, dtype_name),
                              1), dtype_name)


def check(use_bf16, use_fp16, force, devices, rnn_mode, cpuinfo=None):
  """Refuses a --use_bf16 run that cannot be one, with a line saying why.

  Args:
    use_bf16, use_fp16, force: --use_bf16, --use_fp16, --force_bf16.
    devices: the tower devices.
    rnn_mode: the resolved mode (BASIC, BLOCK or CUDNN).
    cpuinfo: the file that lists the CPU's flags (default CPUINFO).

  Raises:
    UserError: with both dtypes; with CUDNN (cuDNN keeps one dtype for its
      products and its cell state, which must stay float32); on CPU towers
      without a bfloat16 unit, unless `force`.
  """
  if not use_bf16:
    return
  if use_fp16:
    raise UserError("--use_bf16 and --use_fp16 exclude each other: choose "
                    "one dtype for the products", exit_code=2)
  if rnn_mode == CUDNN:
    raise UserError("--use_bf16 runs BASIC or BLOCK: cuDNN's LSTM would keep "
                    "its cell state in bfloat16 too; pass --rnn_mode=BLOCK",
                    exit_code=2)
  on_cpu = not any("GPU" in d.upper() for d in devices)
  if on_cpu and not force and not kernels.bf16_units(cpuinfo or CPUINFO):
    raise UserError(
        "--use_bf16: this CPU has no bfloat16 unit (AVX512_BF16 or AMX), "
        "so its bfloat16 products would run slower than float32; pass "
        "--force_bf16 to run them anyway", exit_code=2)
