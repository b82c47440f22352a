"""Graph helpers with explicit arguments: devices, towers, gradients, state.

Nothing here reads flags: devices and sizes are passed in as plain values.
"""

import collections

import tensorflow as tf

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
  LSTM state from step to step exactly as a single device would.
  """
  if num_towers == 1:
    return [tensor]
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


def zero_state(num_layers, batch_size, hidden_size, dtype):
  """A tuple of `num_layers` LSTMStateTuple of zeros, `[batch, hidden]` each."""
  zeros = tf.zeros([batch_size, hidden_size], dtype)
  return tuple(LSTMStateTuple(zeros, zeros) for _ in range(num_layers))


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
