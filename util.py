"""Graph helpers with explicit arguments: devices, towers, gradients, state.

Nothing here reads flags: devices and sizes are passed in as plain values.
The helpers that ptb/ uses too live there (ptb/ imports no top-level
script); they are imported here under their names of the tutorial's util.
"""

import tensorflow as tf

from ptb import low_rank_update
from ptb import original_norm
from ptb.low_rank_update import LowRankGradient
# pylint: disable=unused-import
from ptb.devices import tower_devices
from ptb.lstm import canonical_to_cudnn
from ptb.lstm import cudnn_to_canonical
from ptb.state import LSTMStateTuple
from ptb.state import local_variable
from ptb.state import pack_state
from ptb.state import unpack_state
# pylint: enable=unused-import


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
  """Averages one variable's gradients from several towers.

  Dense tensors are added; IndexedSlices and LowRankGradients (a gradient
  as its factors, ptb/low_rank_update.py) keep their kind, their rows
  concatenated.
  """
  if len(grads) == 1:
    return grads[0]
  if all(isinstance(g, LowRankGradient) for g in grads):
    return low_rank_update.average(grads)
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


class ClippedGradientDescent(tf.compat.v1.train.GradientDescentOptimizer):
  """Plain SGD that first clips the gradients to one global norm.

  Clipping inside apply_gradients puts it after any aggregation (the towers'
  average, the workers' average in synchronous_update), so the norm is that
  of the one update applied. A gradient given as its factors (a
  LowRankGradient, ptb/low_rank_update.py) enters the norm through its Gram
  matrices and updates its variable in one pass, without being formed.
  """

  def __init__(self, learning_rate, max_grad_norm, isa=None, norm_threads=0):
    """The optimizer.

    Args:
      learning_rate: a float or a scalar tensor.
      max_grad_norm: the global norm the gradients are clipped to.
      isa: the kernels' width of ApplyOuterProduct, for LowRankGradients
        (the plan's; plan.Step.isa).
      norm_threads: above 0, the norm is summed as TensorFlow 1.5.1 summed
        it on that many cores (ptb/original_norm.py; plan.Step).
    """
    super().__init__(learning_rate)
    self._max_grad_norm = max_grad_norm
    self._isa = isa
    self._norm_threads = norm_threads
    self._clip_scale = None
    self._factored = []

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    grads_and_vars = list(grads_and_vars)
    self._factored = [(g, v) for g, v in grads_and_vars
                      if isinstance(g, LowRankGradient)]
    norm = self._global_norm(grads_and_vars)
    # tf.clip_by_global_norm's factor (NaN when the norm is not finite).
    # It scales the learning rate instead of the gradients: the same update
    # without a scaled copy of every gradient (200 MB on the large model).
    clip = tf.constant(self._max_grad_norm, norm.dtype)
    self._clip_scale = tf.where(tf.math.is_finite(norm),
                                clip * tf.minimum(1.0 / norm, 1.0 / clip),
                                tf.constant(float("nan"), norm.dtype))
    # The LowRankGradients' updates join the others in _finish.
    dense = [(g, v) for g, v in grads_and_vars
             if not isinstance(g, LowRankGradient)]
    return super().apply_gradients(dense, global_step, name)

  def _global_norm(self, grads_and_vars):
    """The global norm, from the factors where a gradient has them."""
    if self._norm_threads:
      return original_norm.global_norm(grads_and_vars, self._norm_threads)
    dense = [g for g, _ in grads_and_vars
             if not isinstance(g, LowRankGradient)]
    if not self._factored:
      return tf.linalg.global_norm(dense)
    squares = [low_rank_update.squared_norm(g) for g, _ in self._factored]
    if dense:
      squares.append(tf.square(tf.linalg.global_norm(dense)))
    return tf.sqrt(tf.add_n(squares))

  def _prepare(self):
    super()._prepare()
    self._learning_rate_tensor = self._learning_rate_tensor * tf.cast(
        self._clip_scale, self._learning_rate_tensor.dtype)

  def _finish(self, update_ops, name_scope):
    """The dense updates, and the LowRankGradients' (ApplyOuterProduct).

    Called by apply_gradients in its name scope, the learning rate
    prepared (clipped), before the global step's increment.
    """
    for g, v in self._factored:
      with tf.name_scope("update_" + v.op.name), \
          tf.compat.v1.colocate_with(v):
        update_ops.append(low_rank_update.apply(
            v, g, self._learning_rate_tensor, self._isa))
    return super()._finish(update_ops, name_scope)


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
    grads_and_vars: this replica's gradients (tensors, IndexedSlices, or
      LowRankGradients, which the accumulators take formed).
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
        if isinstance(grad, LowRankGradient):
          grad = low_rank_update.dense(grad, var.shape)
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


def train_op(tower_grads, variables, lr, max_grad_norm, replica=(0, 1),
             isa=None, norm_threads=0):
  """The training op: the towers' average gradient, clipped, applied by SGD.

  Args:
    tower_grads: one list of gradients per tower, in the order of variables
      (tensors, IndexedSlices or LowRankGradients).
    variables: the trainable variables.
    lr: the learning rate (a variable).
    max_grad_norm: the global norm the gradients are clipped to.
    replica: (index, count) of the processes that train together; with
      several, each step's update is the average of one gradient from each
      (synchronous_update).
    isa: the kernels' width for the LowRankGradients' updates (the plan's).
    norm_threads: the clipping norm summed as TensorFlow 1.5.1 on that many
      cores; 0: exactly (ClippedGradientDescent).
  """
  grads_and_vars = zip(average_gradients(tower_grads), variables)
  optimizer = ClippedGradientDescent(lr, max_grad_norm, isa, norm_threads)
  global_step = tf.compat.v1.train.get_or_create_global_step()
  if replica[1] > 1:
    return synchronous_update(grads_and_vars, optimizer, global_step,
                              *replica)
  return optimizer.apply_gradients(grads_and_vars, global_step=global_step)
