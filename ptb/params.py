"""The model's weights, by name, and the variables that hold them."""

import collections

import tensorflow as tf

from ptb.config import CUDNN


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

  In the current variable scope ("Model"): `embedding`, `softmax_w` and
  `softmax_b` as the original names them, and per layer `RNN/cell_K/kernel`
  and `RNN/cell_K/bias`, one name for every mode (the original's depended
  on the cell: `RNN/multi_rnn_cell/cell_K/basic_lstm_cell/kernel` in BASIC,
  `.../lstm_cell/kernel` in BLOCK, one opaque `lstm_params` in CUDNN).

  Initial values as the original's: the scope's initializer (uniform in
  ±init_scale) everywhere but the LSTM biases of BASIC and BLOCK, which
  start at zero as its BasicLSTMCell and LSTMBlockCell built them. CUDNN's
  biases take the scope's initializer, as the original's opaque buffer did.
  """
  size, vocab = config.hidden_size, config.vocab_size
  bias_init = None if config.rnn_mode == CUDNN else tf.zeros_initializer()
  embedding = tf.compat.v1.get_variable("embedding", [vocab, size], dtype)
  kernels, biases = [], []
  for layer in range(config.num_layers):
    with tf.compat.v1.variable_scope("RNN/cell_%d" % layer):
      kernels.append(tf.compat.v1.get_variable(
          "kernel", [2 * size, 4 * size], dtype))
      biases.append(tf.compat.v1.get_variable(
          "bias", [4 * size], dtype, initializer=bias_init))
  softmax_w = tf.compat.v1.get_variable("softmax_w", [size, vocab], dtype)
  softmax_b = tf.compat.v1.get_variable("softmax_b", [vocab], dtype)
  return Params(embedding, kernels, biases, softmax_w, softmax_b)
