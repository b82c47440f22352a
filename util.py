"""Graph helpers with explicit arguments: devices, towers, gradients, state.

Nothing here reads flags: devices and sizes are passed in as plain values.
"""

import collections

import tensorflow as tf

from ptb import low_rank_update

# One layer's LSTM state, as in the original tutorial: c is the cell, h the
# output. Both are `[batch_size, hidden_size]`.
LSTMStateTuple = collections.namedtuple("LSTMStateTuple", ("c", "h"))


def tower_devices(num_gpus, num_cpu_towers=1):
  """Lists the devices that the training towers run on.

  Args:
    num_gpus: GPUs to train on; 0 trains on the CPU.
    num_cpu_towers: with num_gpus == 0, how many towers to place on virtual CPU
      devices (the session must then be created with
      `ConfigProto(device_count={"CPU": num_cpu_towers})`). Several CPU towers
      compute nothing faster; they test the multi-tower code without GPUs.

  Returns:
    A list of device strings, one per tower.
  """
  if num_gpus > 0:
    return ["/gpu:%d" % i for i in range(num_gpus)]
  return ["/cpu:%d" % i for i in range(num_cpu_towers)]


def variable_device(devices):
  """Where the shared variables live for these tower devices.

  One tower keeps its variables on its own device, so a single GPU never
  copies weights. Several towers keep them on the host CPU: every tower then
  reads them over the same path, the averaged gradient is applied once, and
  no GPU holds more than its own activations.
  """
  return devices[0] if len(devices) == 1 else "/cpu:0"


def split_rows(tensor, num_towers):
  """Splits `[num_towers * batch, ...]` into `num_towers` row blocks.

  Tower k gets rows `[k*batch, (k+1)*batch)`: each row is one contiguous
  stream of the corpus, so each tower owns its streams and carries their
  LSTM state from step to step exactly as a single device would. A None
  tensor (no weights) gives None to every tower.
  """
  if tensor is None or num_towers == 1:
    return [tensor] * num_towers
  return tf.split(tensor, num_towers, axis=0)


def _average(grads):
  """Averages one variable's gradients from several towers."""
  if len(grads) == 1:
    return grads[0]
  scale = 1.0 / len(grads)
  if all(isinstance(g, tf.IndexedSlices) for g in grads):
    # Sparse (embedding) gradients stay sparse: concatenating the rows keeps
    # the same multiset of rows, hence the same global norm, as one tower
    # with all the rows would produce.
    return tf.IndexedSlices(
        tf.concat([g.values for g in grads], 0) * scale,
        tf.concat([g.indices for g in grads], 0), grads[0].dense_shape)
  return tf.add_n([tf.convert_to_tensor(g) for g in grads]) * scale


def average_gradients(tower_grads):
  """Averages gradients across towers.

  Args:
    tower_grads: one list per tower of gradients (tensors or IndexedSlices),
      all lists in the same variable order.

  Returns:
    A list with one averaged gradient per variable.
  """
  return [_average(list(grads)) for grads in zip(*tower_grads)]


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


class ClippedGradientDescent(tf.compat.v1.train.GradientDescentOptimizer):
  """Plain SGD that first clips the gradients to one global norm.

  Clipping inside apply_gradients puts it after any aggregation (the towers'
  average, the workers' average in synchronous_update), so the norm is that
  of the one update applied. A gradient recorded as a product of few rows
  (ptb/low_rank_update.py) enters the norm through its Gram matrices and
  updates its variable in one pass, without being formed.
  """

  def __init__(self, learning_rate, max_grad_norm):
    super().__init__(learning_rate)
    self._max_grad_norm = max_grad_norm
    self._clip_scale = None
    self._factors = {}

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    grads_and_vars = list(grads_and_vars)
    self._factors = {}
    for g, v in grads_and_vars:
      found = low_rank_update.factors(g, v)
      if found is not None:
        self._factors[v.ref()] = found
    norm = self._global_norm(grads_and_vars)
    # tf.clip_by_global_norm's factor (NaN when the norm is not finite).
    # It scales the learning rate instead of the gradients: the same update
    # without a scaled copy of every gradient (200 MB on the large model).
    clip = tf.constant(self._max_grad_norm, norm.dtype)
    self._clip_scale = tf.where(tf.math.is_finite(norm),
                                clip * tf.minimum(1.0 / norm, 1.0 / clip),
                                tf.constant(float("nan"), norm.dtype))
    return super().apply_gradients(grads_and_vars, global_step, name)

  def _global_norm(self, grads_and_vars):
    """The global norm, from the factors where a gradient has them."""
    dense = [g for g, v in grads_and_vars if v.ref() not in self._factors]
    if not self._factors:
      return tf.linalg.global_norm(dense)
    squares = [low_rank_update.squared_norm(x, g)
               for x, g in self._factors.values()]
    if dense:
      squares.append(tf.square(tf.linalg.global_norm(dense)))
    return tf.sqrt(tf.add_n(squares))

  def _prepare(self):
    super()._prepare()
    self._learning_rate_tensor = self._learning_rate_tensor * tf.cast(
        self._clip_scale, self._learning_rate_tensor.dtype)

  def _resource_apply_dense(self, grad, handle):
    found = self._factors.get(handle.ref())
    if found is None:
      return super()._resource_apply_dense(grad, handle)
    return low_rank_update.apply(handle, *found, self._learning_rate_tensor)


def synchronous_update(grads_and_vars, optimizer, global_step, replica,
                       num_replicas):
  """One update per step from the average of every replica's gradients.

  Between-graph replication: each of `num_replicas` processes builds this
  with its own `replica` index. Every replica puts its gradients into
  accumulators on the variables' devices (the parameter servers); replica 0
  (the chief) takes their average once all replicas have contributed,
  applies it with `optimizer` (which clips), and then hands one token to each
  replica's own queue. A replica waits for its own token, so no replica can
  run ahead and contribute twice to one step: every step averages exactly one
  gradient per replica, like the towers of one process.
  (SyncReplicasOptimizer shares one token queue, from which a fast replica
  may take a slow one's token.)

  Args:
    grads_and_vars: this replica's gradients (tensors or IndexedSlices).
    optimizer: applies the averaged gradients.
    global_step: incremented once per update.
    replica, num_replicas: this replica's index and the count.

  Returns:
    The train op of this replica.
  """
  grads_and_vars = list(grads_and_vars)
  local_step = local_variable(tf.constant(0, tf.int64), "sync_local_step")
  pushes, accumulators = [], []
  for grad, var in grads_and_vars:
    with tf.device(var.device):
      shared = "sync_accumulator/" + var.op.name
      if isinstance(grad, tf.IndexedSlices):
        # Summed, and divided by the replicas below: its "MEAN" divides each
        # row by the replicas whose gradient holds that row, so a word in
        # one replica's rows only would get the full step instead of 1/N.
        acc = tf.compat.v1.SparseConditionalAccumulator(
            grad.dtype, var.shape, shared_name=shared, reduction_type="SUM")
        pushes.append(acc.apply_indexed_slices_grad(grad, local_step))
      else:
        acc = tf.compat.v1.ConditionalAccumulator(grad.dtype, var.shape,
                                                  shared_name=shared)
        pushes.append(acc.apply_grad(grad, local_step))
      accumulators.append(acc)
  with tf.device(global_step.device):
    tokens = [tf.queue.FIFOQueue(-1, tf.int64, shapes=[[]],
                                 shared_name="sync_token_queue_%d" % r)
              for r in range(num_replicas)]
  ready = tf.group(*pushes)
  if replica == 0:
    with tf.control_dependencies([ready]):
      averaged = []
      for acc, (_, var) in zip(accumulators, grads_and_vars):
        with tf.device(var.device):
          if isinstance(acc, tf.compat.v1.SparseConditionalAccumulator):
            total = acc.take_indexed_slices_grad(num_replicas)
            averaged.append(tf.IndexedSlices(
                total.values / num_replicas, total.indices,
                total.dense_shape))
          else:
            averaged.append(acc.take_grad(num_replicas))
      update = optimizer.apply_gradients(
          zip(averaged, [v for _, v in grads_and_vars]), global_step)
    with tf.control_dependencies([update]), tf.device(global_step.device):
      ready = tf.group(*[q.enqueue(local_step) for q in tokens])
  with tf.control_dependencies([ready]):
    token = tokens[replica].dequeue()
  with tf.control_dependencies([token]):
    return local_step.assign_add(1)


def pack_state(state):
  """Packs a tuple of LSTMStateTuple into one `[layers, 2, batch, hidden]`."""
  return tf.stack([tf.stack([s.c, s.h]) for s in state])


def unpack_state(packed, num_layers):
  """Inverse of pack_state."""
  return tuple(LSTMStateTuple(packed[i, 0], packed[i, 1])
               for i in range(num_layers))


# cuDNN orders an LSTM's gates (input, forget, candidate, output); the
# canonical kernel orders them (input, candidate, forget, output).
_CUDNN_FROM_CANONICAL = (0, 2, 1, 3)


def canonical_to_cudnn(kernel, bias, input_size):
  """Converts canonical LSTM weights to cuDNN's canonical lists.

  Plain reshape/split/transpose/concat ops, so the conversion runs (and is
  tested) on any device.

  Args:
    kernel: `[input_size + hidden, 4 * hidden]`, gate blocks (i, j, f, o).
    bias: `[4 * hidden]`, same blocks.
    input_size: rows of the kernel that multiply the layer input.

  Returns:
    (weights, biases): 8 matrices `[hidden, input_size]` (input weights
    W_i, W_f, W_c, W_o) and `[hidden, hidden]` (recurrent weights R_i, R_f,
    R_c, R_o), and 8 vectors `[hidden]`: the input biases in cuDNN order, then
    four zero recurrent biases (cuDNN adds both; the model has one).
  """
  def reorder(blocks):
    return [blocks[k] for k in _CUDNN_FROM_CANONICAL]

  w_x = reorder(tf.split(kernel[:input_size], 4, axis=1))
  w_h = reorder(tf.split(kernel[input_size:], 4, axis=1))
  weights = [tf.transpose(w) for w in w_x + w_h]
  b = reorder(tf.split(bias, 4))
  return weights, b + [tf.zeros_like(b[0])] * 4


def cudnn_to_canonical(weights, biases):
  """Inverse of canonical_to_cudnn: returns (kernel, bias).

  The two cuDNN bias vectors of each gate are added into the one canonical
  bias, so converting there and back is exact.
  """
  def canonical(blocks):
    return [blocks[_CUDNN_FROM_CANONICAL.index(k)] for k in range(4)]

  w_x = canonical([tf.transpose(w) for w in weights[:4]])
  w_h = canonical([tf.transpose(w) for w in weights[4:]])
  kernel = tf.concat([tf.concat(w_x, 1), tf.concat(w_h, 1)], 0)
  bias = tf.concat(canonical([a + b for a, b in zip(biases[:4], biases[4:])]),
                   0)
  return kernel, bias
