"""Dropout as explicit masks, drawn from a key that checkpoints carry.

The model draws one mask `[steps, batch, hidden]` per place (embeddings,
between layers, before the softmax) at every session call; the BASIC
wavefront (wavefront.py) applies the ones between layers chunk by chunk.

The masks are stateless draws from (key, call count), both held in
variables. A stateful random op would restart its sequence in every new
session, so a resumed run would draw other masks than the uninterrupted
one; restored from a checkpoint, these two variables make the resumed run
draw exactly the masks it would have drawn.
"""

import tensorflow as tf

# The variables call_seed creates, by name: a checkpoint written before
# they existed lacks them (see checkpoint.Checkpointer's `optional`).
SEED_VARIABLES = ("dropout/key", "dropout/draws")


def call_seed():
  """A seed of its own for every session call that evaluates it.

  Creates two int64 variables: the key, drawn once (from the graph seed, so
  --seed fixes it), and the count of calls so far.

  Returns:
    int64 `[2]`: (key, count after this call), for tf.random's stateless ops.
  """
  # At the top of the graph, whatever the caller's scope: the names are
  # SEED_VARIABLES. On the host: int64 scalars, which GPUs keep there anyway.
  with tf.compat.v1.name_scope(None), tf.compat.v1.name_scope("dropout/"), \
      tf.device("/cpu:0"):
    key = tf.compat.v1.Variable(
        tf.random.uniform([], 0, 2 ** 62, tf.int64), trainable=False,
        name="key")
    draws = tf.compat.v1.Variable(tf.constant(0, tf.int64), trainable=False,
                                  name="draws")
    return tf.stack([key.read_value(), draws.assign_add(1, read_value=True)])


def tower_seeds(num_towers, enabled):
  """Each tower's dropout seed for this call: call_seed folded with its index.

  Args:
    num_towers: the model's towers.
    enabled: whether the model drops out; if not, nothing is created.

  Returns:
    num_towers int64 `[2]` tensors, or num_towers Nones without dropout.
  """
  if not enabled:
    return [None] * num_towers
  seed = call_seed()
  with tf.device("/cpu:0"):
    return [tf.random.experimental.stateless_fold_in(seed, k)
            for k in range(num_towers)]


def mask(shape, keep_prob, dtype, seed):
  """A mask: each entry 1 / keep_prob with probability keep_prob, else 0.

  Drawn as tf.nn.dropout draws it (uniform >= 1 - keep_prob), from `seed`
  (int64 `[2]`) with tf.random.stateless_uniform.
  """
  keep = tf.random.stateless_uniform(shape, seed) >= 1 - keep_prob
  return tf.cast(keep, dtype) / tf.cast(keep_prob, dtype)


def model_masks(shape, keep_prob, num_layers, dtype, seed):
  """The model's masks, {} without a seed or when keep_prob is 1.

  Args:
    shape: `[steps, batch, hidden]` of every mask.
    keep_prob: the config's keep probability.
    num_layers: the LSTM layers.
    dtype: the model's dtype.
    seed: int64 `[2]`, this tower's seed for this call (tower_seeds), or
      None for a model without dropout (validation, test).

  Returns:
    {"input": on the embeddings, "layers": one per layer but the last, on
    its outputs, "output": before the softmax}, each from `seed` folded
    with its place's index (0 to num_layers).
  """
  if seed is None or keep_prob >= 1:
    return {}
  masks = [mask(shape, keep_prob, dtype,
                tf.random.experimental.stateless_fold_in(seed, place))
           for place in range(num_layers + 1)]
  return {"input": masks[0], "layers": masks[1:-1], "output": masks[-1]}
