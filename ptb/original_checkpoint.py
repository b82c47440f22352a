"""The 2018 original's checkpoints: its variable names, written and read.

The original (TensorFlow 1.5, its contrib cells) named its weights after the cells
that made them; the port names them once for every mode (ptb/params.py).
Both keep the same values in the same layout: a kernel `[I + H, 4H]` that
multiplies the inputs and then h, with gate blocks (i, j, f, o), as
BasicLSTMCell and LSTMBlockCell computed them. So a checkpoint converts by
renaming alone:

  port                      original
  Model/embedding           Model/embedding
  Model/RNN/cell_K/kernel   Model/RNN/multi_rnn_cell/cell_K/CELL/kernel
  Model/RNN/cell_K/bias     Model/RNN/multi_rnn_cell/cell_K/CELL/bias
  Model/softmax_w           Model/softmax_w
  Model/softmax_b           Model/softmax_b

CELL is `basic_lstm_cell` (BASIC, which the original forced whenever
--num_gpus was not 1) or `lstm_cell` (BLOCK). The original's Supervisor
restores every global variable of its graph, so a checkpoint for it also
holds its learning rate `Train/Model/Variable` and `Model/global_step`.
CUDNN's single opaque buffer `Model/lstm_params` is not read.
"""

import numpy as np
import tensorflow as tf

from ptb.errors import UserError

BASIC_CELL = "basic_lstm_cell"
BLOCK_CELL = "lstm_cell"
# The original's non-weight variables that its Supervisor restores.
LEARNING_RATE = "Train/Model/Variable"
GLOBAL_STEP = "Model/global_step"


def original_name(port_name, cell=BASIC_CELL):
  """The original's name for the port's variable `port_name`."""
  prefix = "Model/RNN/cell_"
  if not port_name.startswith(prefix):
    return port_name
  layer, leaf = port_name[len(prefix):].split("/")
  return "Model/RNN/multi_rnn_cell/cell_%s/%s/%s" % (layer, cell, leaf)


def initial_values(config, seed):
  """The port's initial weights for `config` under graph seed `seed`.

  As a run builds them (uniform in ±init_scale, LSTM biases zero), in a
  graph of their own: the same `seed` gives the same values.

  Returns:
    {port name: float32 array}, the names of params.Params.as_list.
  """
  from ptb.params import create_params  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(seed)
    initializer = tf.compat.v1.random_uniform_initializer(
        -config.init_scale, config.init_scale)
    with tf.compat.v1.variable_scope("Model", initializer=initializer):
      variables = create_params(config, tf.float32).as_list()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      values = session.run(variables)
  return {v.op.name: x for v, x in zip(variables, values)}


def write(path, weights, cell=BASIC_CELL, learning_rate=0.0, global_step=0):
  """Writes `weights` as a checkpoint the original restores.

  Args:
    path: the checkpoint's prefix; a `checkpoint` file beside it names it,
      so a directory holding it is a --save_path the original resumes from.
    weights: {port name: array}, as initial_values or read return.
    cell: the original's cell name, BASIC_CELL or BLOCK_CELL.
    learning_rate, global_step: the values of the original's two other
      variables (it assigns the learning rate itself every epoch).

  Returns:
    The path written.
  """
  with tf.Graph().as_default():
    variables = [tf.compat.v1.Variable(np.asarray(value, np.float32),
                                       name=original_name(name, cell))
                 for name, value in sorted(weights.items())]
    variables.append(tf.compat.v1.Variable(
        np.float32(learning_rate), trainable=False, name=LEARNING_RATE))
    variables.append(tf.compat.v1.Variable(
        np.int64(global_step), trainable=False, name=GLOBAL_STEP))
    saver = tf.compat.v1.train.Saver(variables, write_version=2)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return saver.save(session, path, write_meta_graph=False)


def checkpoint_names(ckpt):
  """{port name: name in `ckpt`} for the weights `ckpt` holds.

  `ckpt` may be the port's or the original's (either cell); names it holds
  that are no weight (progress, learning rate, optimizer slots) are left
  out.
  """
  shapes = tf.train.load_checkpoint(ckpt).get_variable_to_shape_map()
  found = {}
  for name in shapes:
    port = _port_name(name)
    if port is not None:
      if port in found:
        raise UserError("%s holds two variables for the weight %s: %s and %s"
                        % (ckpt, port, found[port], name))
      found[port] = name
  return found


def _port_name(name):
  """The port's name for checkpoint variable `name`, or None if no weight."""
  if name in ("Model/embedding", "Model/softmax_w", "Model/softmax_b"):
    return name
  parts = name.split("/")
  if (len(parts) == 4 and parts[:2] == ["Model", "RNN"]
      and parts[2].startswith("cell_") and parts[3] in ("kernel", "bias")):
    return name
  if (len(parts) == 6 and parts[:3] == ["Model", "RNN", "multi_rnn_cell"]
      and parts[3].startswith("cell_")
      and parts[4] in (BASIC_CELL, BLOCK_CELL)
      and parts[5] in ("kernel", "bias")):
    return "Model/RNN/%s/%s" % (parts[3], parts[5])
  return None


def read(ckpt):
  """The weights of `ckpt` (the port's or the original's), by port name."""
  reader = tf.train.load_checkpoint(ckpt)
  return {port: reader.get_tensor(name)
          for port, name in checkpoint_names(ckpt).items()}


def resolve(path):
  """The checkpoint prefix that `path` (a prefix or a directory) names.

  Raises:
    UserError: no checkpoint there.
  """
  if tf.io.gfile.isdir(path):
    ckpt = tf.train.latest_checkpoint(path)
    if ckpt is None:
      raise UserError("--init_from: no checkpoint in %s" % path)
    return ckpt
  if not tf.io.gfile.exists(path + ".index"):
    raise UserError("--init_from: no checkpoint %s (no %s.index)"
                    % (path, path))
  return path


def check_flags(init_from_path, eval_only, save_path, config=None,
                dtype=tf.float32):
  """Checks --init_from and --eval_only before any work.

  With `config`, the checkpoint must hold every weight that config builds
  in `dtype`, with its shape.

  Returns:
    The checkpoint prefix to start from, or None.

  Raises:
    UserError: --eval_only without --init_from or with --save_path (it
      trains and saves nothing), no checkpoint at --init_from, or one whose
      weights this config cannot take.
  """
  if eval_only and not init_from_path:
    raise UserError("--eval_only evaluates the weights of --init_from: give "
                    "--init_from=CHECKPOINT", exit_code=2)
  if eval_only and save_path:
    raise UserError("--eval_only trains and saves nothing: drop --save_path",
                    exit_code=2)
  if not init_from_path:
    return None
  ckpt = resolve(init_from_path)
  if config is not None:
    from ptb.params import create_params  # pylint: disable=g-import-not-at-top
    with tf.Graph().as_default(), tf.compat.v1.variable_scope("Model"):
      _matching_names(ckpt, create_params(config, dtype).as_list())
  return ckpt


def _matching_names(ckpt, variables):
  """{name in `ckpt`: variable} for `variables`, each found and fitting.

  Raises:
    UserError: a weight missing, or of another shape or dtype.
  """
  names = checkpoint_names(ckpt)
  saved = tf.train.load_checkpoint(ckpt)
  shapes = saved.get_variable_to_shape_map()
  dtypes = saved.get_variable_to_dtype_map()
  assignment = {}
  for variable in variables:
    port = variable.op.name
    if port not in names:
      raise UserError("--init_from: %s holds no weight %s (or the original's "
                      "name for it)" % (ckpt, port))
    name = names[port]
    if list(shapes[name]) != variable.shape.as_list():
      raise UserError("--init_from: %s has %s of shape %s; this config's is "
                      "%s" % (ckpt, name, list(shapes[name]),
                              variable.shape.as_list()))
    if dtypes[name] != variable.dtype.base_dtype:
      raise UserError("--init_from: %s holds %s as %s; this run's is %s"
                      % (ckpt, name, dtypes[name].name,
                         variable.dtype.base_dtype.name))
    assignment[name] = variable
  return assignment


def init_from(path, variables):
  """Makes `variables` start from the weights of the checkpoint at `path`.

  The port's or the original's names (checkpoint_names); every variable
  must find its weight with its shape and dtype. Call before the
  initializer op is made: the variables' initial values become the
  checkpoint's.

  Args:
    path: a checkpoint prefix, or a directory whose latest checkpoint it is.
    variables: the model's weight variables (params.Params.as_list).

  Returns:
    The checkpoint prefix read.

  Raises:
    UserError: no checkpoint, a weight missing, or of another shape or
      dtype (a float32 checkpoint in a --use_fp16 run, say).
  """
  ckpt = resolve(path)
  tf.compat.v1.train.init_from_checkpoint(ckpt,
                                          _matching_names(ckpt, variables))
  return ckpt
