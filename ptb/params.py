"""The model's weights, by name, and the variables that hold them."""

import collections

import tensorflow as tf


class Params(collections.namedtuple(
    "Params", ("embedding", "kernels", "biases", "softmax_w", "softmax_b"))):
  """The model's weights.

  Attributes:
    embedding: `[vocab, hidden]`.
    kernels, biases: one per layer, `[2 * hidden, 4 * hidden]` and
      `[4 * hidden]`.
    softmax_w, softmax_b: `[hidden, vocab]` and `[vocab]`.
  """

  def as_list(self):
    """The variables in their creation order, the gradients' order."""
    layers = [v for pair in zip(self.kernels, self.biases) for v in pair]
    return [self.embedding] + layers + [self.softmax_w, self.softmax_b]


def create_params(config, dtype):
  """Creates the shared weights: the embedding, each layer's, the softmax.

  In the current variable scope, under the original's names, so that the
  checkpoints of every mode and of the tutorial's layout agree.
  """
  size, vocab = config.hidden_size, config.vocab_size
  embedding = tf.compat.v1.get_variable("embedding", [vocab, size], dtype)
  kernels, biases = [], []
  for layer in range(config.num_layers):
    with tf.compat.v1.variable_scope("RNN/cell_%d" % layer):
      kernels.append(tf.compat.v1.get_variable(
          "kernel", [2 * size, 4 * size], dtype))
      biases.append(tf.compat.v1.get_variable("bias", [4 * size], dtype))
  softmax_w = tf.compat.v1.get_variable("softmax_w", [size, vocab], dtype)
  softmax_b = tf.compat.v1.get_variable("softmax_b", [vocab], dtype)
  return Params(embedding, kernels, biases, softmax_w, softmax_b)
