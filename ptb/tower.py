"""One tower's graph, from word ids to its cost: the model of the tutorial.

Embedding, input dropout, the LSTM stack (lstm.py, with dropout between
layers), output dropout, the softmax loss (softmax.py). PTBModel builds one
tower per device, each on its own rows of the batch, and trains them
together.
"""

import tensorflow as tf

from ptb import dropout
from ptb import lstm
from ptb import softmax
from ptb import state as state_lib
from ptb.state import TowerState


def build(input_data, targets, weights, params, config, dtype, seed, plan,
          factors):
  """One tower's (cost, TowerState); cost sums the batch-averaged loss.

  Args:
    input_data, targets: int32 `[batch, steps]`.
    weights: float32 `[batch, steps]` or None (all ones).
    params: the model's params.Params.
    config: a config instance (hidden_size, num_layers, keep_prob).
    dtype: the variables' and activations' dtype.
    seed: int64 `[2]`, this tower's dropout seed, or None (no dropout).
    plan: the model's plan.Step (LSTM path, products, softmax loss).
    factors: None, or the dict in which the backward pass leaves the
      gradients it gives as factors (low_rank_update.py).

  Returns:
    cost: float32 `[]`; TowerState: the state variable, the initial and
    final state (tuples of LSTMStateTuple, `[batch, hidden]` each), the
    dropout masks ({} without).
  """
  batch_size = input_data.shape[0]
  size, num_layers = config.hidden_size, config.num_layers

  # The state lives in the graph (the original fed it, and not at all with
  # --num_gpus=0): a step needs no feed.
  state_var, initial_state = state_lib.tower_state(num_layers, batch_size,
                                                   size, dtype)

  # Time-major from here on: [steps, batch, ...].
  inputs = tf.nn.embedding_lookup(params.embedding, tf.transpose(input_data))
  # Dropout masks (dropout.py): the wavefront applies those between layers.
  masks = dropout.model_masks([input_data.shape[1], batch_size, size],
                              config.keep_prob, num_layers, dtype, seed)
  if masks:
    inputs *= masks["input"]
  inputs, final_state = lstm.lstm_stack(
      plan.lstm, inputs, initial_state, params.kernels, params.biases,
      masks.get("layers"), factors)
  if masks:
    inputs *= masks["output"]

  output = tf.reshape(inputs, [-1, size])
  loss = softmax.softmax_loss(plan.softmax, output, params.softmax_w,
                              params.softmax_b,
                              tf.reshape(tf.transpose(targets), [-1]),
                              factors)
  if weights is not None:
    loss *= tf.reshape(tf.transpose(weights), [-1])
  cost = tf.reduce_sum(loss) / tf.cast(batch_size, tf.float32)
  return cost, TowerState(state_var, initial_state, tuple(final_state), masks)
