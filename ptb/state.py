"""What a process carries from one step to the next: LSTM state, local variables.

The LSTM's final state of a step is the initial state of the next. It is
kept in one local variable per tower, packed as `[layers, 2, batch, hidden]`;
the data position and the synchronous step counter are local variables too.
Both util.py and the modules of ptb/ use these, so they live here.
"""

import collections

import tensorflow as tf

# One layer's LSTM state, as in the original tutorial: c is the cell, h the
# output. Both are `[batch_size, hidden_size]`.
LSTMStateTuple = collections.namedtuple("LSTMStateTuple", ("c", "h"))

# One tower's LSTM state: the local variable that carries it from call to
# call, the initial and the final state (tuples of LSTMStateTuple), and the
# dropout masks (see ptb_word_lm.PTBModel.dropout_masks).
TowerState = collections.namedtuple(
    "TowerState", ("variable", "initial", "final", "masks"))


def pack_state(state):
  """Packs a tuple of LSTMStateTuple into one `[layers, 2, batch, hidden]`."""
  return tf.stack([tf.stack([s.c, s.h]) for s in state])


def unpack_state(packed, num_layers):
  """Inverse of pack_state."""
  return tuple(LSTMStateTuple(packed[i, 0], packed[i, 1])
               for i in range(num_layers))


def local_variable(initial_value, name):
  """A non-trainable variable that stays on the device of the current scope.

  Local variables (LSTM state, data position) belong to one process. Under a
  replica_device_setter every variable would go to a parameter server;
  colocating with an op created here keeps them on this worker, as
  SyncReplicasOptimizer does for its local step. They are in
  LOCAL_VARIABLES, so the default Saver and global initialiser skip them.
  """
  anchor = tf.no_op(name=name + "_anchor")
  with tf.compat.v1.colocate_with(anchor):
    return tf.compat.v1.Variable(
        initial_value, trainable=False, name=name,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


def tower_state(num_layers, batch_size, hidden_size, dtype):
  """A tower's LSTM state variable and the initial state read from it.

  The original fed the state through feed_dict, and with --num_gpus=0 it
  re-imported zero replicas of the training state: nothing was fed and every
  step started from zeros. Here the state lives in the graph, the same way
  on every device setting; store_and_reset(carry=False) trains as the
  original did on the CPU.

  Returns:
    (the `[layers, 2, batch, hidden]` local variable, its value as a tuple
    of LSTMStateTuple).
  """
  variable = local_variable(
      tf.zeros([num_layers, 2, batch_size, hidden_size], dtype), "lstm_state")
  return variable, unpack_state(variable.read_value(), num_layers)


def store_and_reset(states, after, carry=True):
  """The ops that store and that zero the towers' LSTM states.

  Args:
    states: one TowerState per tower.
    after: the ops of the step (cost, training op): the final state is
      stored only once the step has read the old one.
    carry: store the final states; False leaves the variables as the
      reset left them, so that every step starts from zeros.

  Returns:
    (update: stores each final state in its variable, or only runs `after`
    without `carry`; reset: zeroes them).
  """
  with tf.control_dependencies(after):
    update = tf.group(*[s.variable.assign(pack_state(s.final))
                        for s in states if carry])
  return update, tf.group(*[s.variable.initializer for s in states])
