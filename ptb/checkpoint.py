"""Checkpoints of a run: its progress variables and the Saver around them."""

import os

import tensorflow as tf

from ptb.errors import UserError


class Progress(object):
  """Where training is, kept in variables so that checkpoints carry it.

  epoch: epochs completed; step: training calls done in the epoch after them
  (the epoch size once its training pass is done); costs: the summed cost of
  those calls, so a resumed epoch prints the same train perplexity.
  """

  def __init__(self):
    with tf.compat.v1.variable_scope("Progress"):
      self._vars = [
          tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                name="epoch"),
          tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                name="epoch_step"),
          tf.compat.v1.Variable(0.0, dtype=tf.float64, trainable=False,
                                name="epoch_costs")]
      self._values = [tf.compat.v1.placeholder(v.dtype, []) for v in self._vars]
      self._assign = tf.group(*[v.assign(p)
                                for v, p in zip(self._vars, self._values)])

  def set(self, session, epoch, step, costs):
    session.run(self._assign, dict(zip(self._values, (epoch, step, costs))))

  def get(self, session):
    epoch, step, costs = session.run(self._vars)
    return int(epoch), int(step), float(costs)


class Checkpointer(object):
  """Saves and restores a run in `save_path`, refusing foreign checkpoints."""

  def __init__(self, save_path, var_list):
    self._save_path = save_path
    self._var_list = var_list
    self._saver = tf.compat.v1.train.Saver(var_list, max_to_keep=2,
                                           save_relative_paths=True)

  @staticmethod
  def check_writable(save_path):
    """Creates `save_path` if needed and proves a file can be written there."""
    try:
      os.makedirs(save_path, exist_ok=True)
      probe = os.path.join(save_path, ".write_test.%d" % os.getpid())
      with open(probe, "w") as f:
        f.write("ok")
      os.remove(probe)
    except OSError as e:
      raise UserError("--save_path=%s cannot be written: %s"
                      % (save_path, e.strerror or e)) from None

  def latest(self):
    return tf.train.latest_checkpoint(self._save_path)

  def check_compatible(self, ckpt):
    """Raises UserError naming the first variable whose shape differs."""
    shapes = tf.train.load_checkpoint(ckpt).get_variable_to_shape_map()
    ours = {v.op.name: v.shape.as_list() for v in self._var_list}
    for name in sorted(set(shapes) | set(ours)):
      theirs, here = shapes.get(name), ours.get(name)
      if theirs != here:
        raise UserError(
            "--save_path=%s holds a checkpoint of another configuration: %s "
            "is %s there and %s here (hidden_size, num_layers, vocab_size, "
            "batch_size, num_steps and the number of towers must match); use "
            "another --save_path" % (
                self._save_path, name,
                "absent" if theirs is None else theirs,
                "absent" if here is None else here))

  def restore(self, session):
    """Restores the latest checkpoint after checking it fits; returns it."""
    ckpt = self.latest()
    self.check_compatible(ckpt)
    self._saver.restore(session, ckpt)
    return ckpt

  def save(self, session, global_step):
    # Saver writes into temporary files and renames them, and moves the
    # `checkpoint` pointer only afterwards: a crash mid-save leaves the
    # previous checkpoint usable.
    return self._saver.save(session, os.path.join(self._save_path,
                                                  "model.ckpt"),
                            global_step=global_step)
