"""The clipping norm as TensorFlow 1.5.1 summed it, to run beside the original.

The original clips with tf.clip_by_global_norm, whose norm is
sqrt(2 * sum of tf.nn.l2_loss of each gradient). TensorFlow 1.5.1's CPU
kernels summed those float32 values in 8 vector lanes per thread block
(kernels.cc, SumAsTf15): on a [200, 10000] gradient that sum comes out up
to 2.2e-4 below the exact one, so the original's clipped steps are that
much longer. At learning rate 1.0 two runs from the same weights part by
more than rounding within an epoch (docs/original.md, "At full size").
--original_norm_threads=N makes this port's norm the same float32 value,
on the original's N cores, so that the two programs can be compared step
for step; 0 (the default) keeps the port's own, nearly exact, sum.
"""

import tensorflow as tf

from ptb import kernels
from ptb import low_rank_update
from ptb.errors import UserError
from ptb.low_rank_update import LowRankGradient


def check(threads, use_fp16):
  """Refuses --original_norm_threads where it cannot run, before any work.

  Args:
    threads: the flag's value (0: off; FLAG_RANGES refuses negatives).
    use_fp16: --use_fp16.

  Raises:
    UserError: with float16 variables (TensorFlow 1.5.1's float32 sums are
      what it copies), or without the kernels' op library.
  """
  if not threads:
    return
  if use_fp16:
    raise UserError("--original_norm_threads copies TensorFlow 1.5.1's "
                    "float32 sums; it cannot run with --use_fp16.")
  try:
    kernels.load_library()
  except (RuntimeError, OSError, tf.errors.OpError) as e:
    raise UserError("--original_norm_threads needs the kernels' op library "
                    "(SumAsTf15), which could not be built or loaded: %s"
                    % e) from e


def summed_tensor(gradient, shape):
  """What TensorFlow 1.5.1's global_norm summed of one gradient.

  Args:
    gradient: a tensor, an IndexedSlices (its values, rows as given, as
      global_norm took them) or a LowRankGradient (formed).
    shape: its variable's shape.

  Returns:
    A float32 tensor.
  """
  if isinstance(gradient, LowRankGradient):
    return low_rank_update.dense(gradient, shape)
  if isinstance(gradient, tf.IndexedSlices):
    return gradient.values
  return gradient


def global_norm(grads_and_vars, threads):
  """tf.clip_by_global_norm's norm as TensorFlow 1.5.1 computed it.

  Each gradient's l2_loss (half its squared norm), stacked in the
  variables' order, summed, doubled, square-rooted, every sum in that
  build's order on `threads` cores.

  Args:
    grads_and_vars: (gradient, variable) pairs, in the order of the
      original's trainable variables (embedding, each layer's kernel and
      bias, softmax_w, softmax_b: the port's order too).
    threads: the cores of the machine the original ran on.

  Returns:
    A float32 scalar.
  """
  library = kernels.load_library()
  halves = [library.sum_as_tf15(summed_tensor(g, v.shape), squares=True,
                                 threads=threads)
            for g, v in grads_and_vars]
  total = library.sum_as_tf15(tf.stack(halves), squares=False,
                              threads=threads)
  return tf.sqrt(total * 2.0)
