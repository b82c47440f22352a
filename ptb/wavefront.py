"""The wavefront's schedule: sequences cut into time chunks and joined again.

BASIC over all layers runs as a wavefront (lstm.basic_stack): layer l + 1
consumes layer l's outputs a chunk of steps at a time instead of waiting
for the whole sequence, and in the backward pass layer l consumes layer
l + 1's input gradient a chunk at a time, so that the layers' step-by-step
recurrences overlap on two cores. This module cuts sequences into chunks
and joins them again; lstm.py runs the passes over the chunks, and the plan
(plan.Lstm.chunk) says how many steps a chunk has and for which models.
"""

import numpy as np
import tensorflow as tf


def split_time(x, chunk=None):
  """Time chunks of at most `chunk` steps (all if None) of `[T, ...]` x.

  A list of blocks `[C, ...]` is passed through: it is already chunked.
  """
  if isinstance(x, (list, tuple)):
    return list(x)
  num_steps = x.shape[0]
  chunk = chunk or num_steps
  if chunk >= num_steps:
    return [x]
  return [x[s:s + chunk] for s in range(0, num_steps, chunk)]


def join_time(blocks):
  """The `[T, ...]` tensor of a list of time blocks."""
  return blocks[0] if len(blocks) == 1 else tf.concat(blocks, 0)


def regroup(steps, sizes):
  """Blocks `[C, ...]` of `sizes` steps each, from a list of `[...]` steps.

  A layer's outputs come step by step; the next layer takes them in the
  chunks of the layer's inputs.
  """
  return [tf.stack(steps[s - n:s]) for s, n in zip(np.cumsum(sizes), sizes)]
