"""The wavefront's schedule: sequences cut into time chunks, and their size.

BASIC over all layers runs as a wavefront (lstm.basic_stack): layer l + 1
consumes layer l's outputs a chunk of steps at a time instead of waiting
for the whole sequence, and in the backward pass layer l consumes layer
l + 1's input gradient a chunk at a time, so that the layers' step-by-step
recurrences overlap on two cores. This module cuts sequences into chunks,
joins them again and says how many steps a chunk has; lstm.py runs the
passes over the chunks.
"""

import numpy as np
import tensorflow as tf


def wavefront_chunk(hidden_size):
  """Steps per chunk of the BASIC wavefront (lstm.basic_stack) for a model.

  On two cores, chunks of 4 steps let the layers' recurrences overlap (small
  and medium train faster than one layer after the other). From hidden size
  1024 on, each layer's step products are bound by memory bandwidth: side
  by side they gain nothing, so the layers run one after the other.
  """
  return 4 if hidden_size < 1024 else None


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
