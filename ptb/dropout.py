"""Dropout as explicit masks, so that a mask can be applied a chunk at a time.

The model draws one mask `[steps, batch, hidden]` per place (embeddings,
between layers, before the softmax) at every session call; the BASIC
wavefront (wavefront.py) applies the ones between layers chunk by chunk.
"""

import tensorflow as tf


def mask(shape, keep_prob, dtype):
  """A mask: each entry 1 / keep_prob with probability keep_prob, else 0.

  Drawn as tf.nn.dropout draws it (uniform >= 1 - keep_prob).
  """
  keep = tf.random.uniform(shape) >= 1 - keep_prob
  return tf.cast(keep, dtype) / tf.cast(keep_prob, dtype)
