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


def model_masks(shape, keep_prob, num_layers, dtype):
  """The model's masks, {} when keep_prob is 1.

  Args:
    shape: `[steps, batch, hidden]` of every mask.
    keep_prob: the config's keep probability (1.0 outside training).
    num_layers: the LSTM layers.
    dtype: the model's dtype.

  Returns:
    {"input": on the embeddings, "layers": one per layer but the last, on
    its outputs, "output": before the softmax}, drawn in that order (with a
    graph seed, the order fixes each mask's draws).
  """
  if keep_prob >= 1:
    return {}
  return {"input": mask(shape, keep_prob, dtype),
          "layers": [mask(shape, keep_prob, dtype)
                     for _ in range(num_layers - 1)],
          "output": mask(shape, keep_prob, dtype)}
