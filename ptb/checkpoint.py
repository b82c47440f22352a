"""Checkpoints of a run: its progress variables and the Saver around them."""

import json
import os
import re

import tensorflow as tf

from ptb.errors import UserError
from ptb.errors import write_failure


# The variables of Progress, by name.
_PROGRESS = ("Progress/epoch", "Progress/epoch_step", "Progress/epoch_costs")
CONFIG_VARIABLE = "Progress/config"


class Progress(object):
  """Where training is, kept in variables so that checkpoints carry it.

  epoch: epochs completed; step: training calls done in the epoch after them
  (the epoch size once its training pass is done); costs: the summed cost of
  those calls, so a resumed epoch prints the same train perplexity.

  Attributes:
    config: a string variable, the JSON of the run's config (see
      resume.record), which every checkpoint records; a restore leaves it
      at this run's.
  """

  def __init__(self, record):
    """Creates the variables; `record` is what checkpoints record of the run."""
    with tf.compat.v1.variable_scope("Progress"):
      self._vars = [
          tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                name="epoch"),
          tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                name="epoch_step"),
          tf.compat.v1.Variable(0.0, dtype=tf.float64, trainable=False,
                                name="epoch_costs")]
      self.config = tf.compat.v1.Variable(
          json.dumps(record, sort_keys=True), trainable=False, name="config")
      self._values = [tf.compat.v1.placeholder(v.dtype, []) for v in self._vars]
      self._assign = tf.group(*[v.assign(p)
                                for v, p in zip(self._vars, self._values)])

  def set(self, session, epoch, step, costs):
    session.run(self._assign, dict(zip(self._values, (epoch, step, costs))))

  def get(self, session):
    epoch, step, costs = session.run(self._vars)
    return int(epoch), int(step), float(costs)


def read_progress(ckpt):
  """The progress that `ckpt` holds, and the config it records.

  Returns:
    (epoch, step, costs, record): as Progress.get, and the record as a dict,
    or None where the checkpoint has none (written by an older version).
  """
  reader = tf.train.load_checkpoint(ckpt)
  epoch, step, costs = (reader.get_tensor(name) for name in _PROGRESS)
  record = None
  if reader.has_tensor(CONFIG_VARIABLE):
    record = json.loads(reader.get_tensor(CONFIG_VARIABLE))
  return int(epoch), int(step), float(costs), record


def candidates(save_path):
  """The checkpoints in `save_path`, newest first; none if it is no directory."""
  if not save_path or not os.path.isdir(save_path):
    return []
  try:
    state = tf.train.get_checkpoint_state(save_path)
  except (tf.errors.OpError, ValueError):  # a damaged `checkpoint` file
    state = None
  if state is not None:
    paths = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path not in paths:
      paths.append(state.model_checkpoint_path)
  else:  # no pointer: the index files, newest first
    names = [n[:-len(".index")] for n in os.listdir(save_path)
             if n.startswith("model.ckpt") and n.endswith(".index")]
    paths = sorted(names, key=lambda n: os.path.getmtime(
        os.path.join(save_path, n + ".index")))
  return [p if os.path.isabs(p) else os.path.join(save_path, p)
          for p in reversed(paths)]


def unreadable(path):
  """Why the checkpoint `path` cannot be restored, or None if it can.

  Every variable is read: a truncated data file shows only there.
  """
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  # The reader raises OpErrors, ValueError, and IndexError on short data.
  except Exception as e:  # pylint: disable=broad-except
    text = getattr(e, "message", None) or str(e)
    return (text.strip().splitlines() or [type(e).__name__])[0]
  return None


def newest_readable(save_path, warn=None):
  """The newest checkpoint in `save_path` that can be read, and the others.

  A damaged one (truncated, missing or corrupt files) is reported through
  `warn` and skipped; nothing is deleted or changed.

  Returns:
    (its path, or None if there is no checkpoint at all; the damaged
    checkpoints skipped, newest first).

  Raises:
    UserError: there are checkpoints, and none of them can be read.
  """
  damaged, reasons = [], []
  for path in candidates(save_path):
    reason = unreadable(path)
    if reason is None:
      return path, damaged
    damaged.append(path)
    if warn:
      warn("skipping the checkpoint %s, which cannot be read (%s)"
           % (path, reason))
    reasons.append("%s: %s" % (os.path.basename(path), reason))
  if reasons:
    raise UserError(
        "no checkpoint in %s can be read (%s); move the damaged files out "
        "of it to start afresh there, or use another --save_path"
        % (save_path, "; ".join(reasons)))
  return None, damaged


def _kind(name):
  """A variable's name without its tower's number: one per tower share it."""
  return re.sub(r"/tower_\d+/", "/tower_k/", name)


def _remove_temporary_files(directory, name=None):
  """Removes what failed saves left in `directory` (of checkpoint `name`).

  Saver writes a checkpoint's files as `NAME.tempstateN` and its pointer
  as `checkpoint.tmpN` before it renames them; a save that failed or was
  killed half-way leaves them, each as large as a checkpoint, and on a
  full disk they hold the room that the next save needs.
  """
  try:
    for entry in os.listdir(directory):
      if ((".tempstate" in entry and
           (name is None or entry.startswith(name + "."))) or
          entry.startswith("checkpoint.tmp")):
        os.remove(os.path.join(directory, entry))
  except OSError:  # the directory has gone, or was never there
    pass


# What a checkpoint whose weights diverged is renamed to (set_aside).
DIVERGED_PREFIX = "diverged-"


class SaveFailed(Exception):
  """A checkpoint could not be written; says why and what survives.

  Attributes:
    path: the checkpoint that could not be written.
    last: the newest checkpoint that can be read, or None.
  """

  def __init__(self, message, path, last):
    super().__init__(message)
    self.path = path
    self.last = last


class Checkpointer(object):
  """Saves and restores a run in `save_path`, refusing foreign checkpoints."""

  def __init__(self, save_path, var_list, optional=(), damaged=()):
    """A Saver of `var_list` in `save_path`.

    Args:
      save_path: the checkpoint directory.
      var_list: the variables saved and restored.
      optional: names of variables that a checkpoint may lack, or hold
        when var_list does not (the dropout seed, absent without dropout
        and before this version); restore initialises the ones it lacks.
      damaged: checkpoints skipped because they cannot be read
        (newest_readable): their files are kept, so a save never reuses
        their names.
    """
    self._save_path = save_path
    self._var_list = var_list
    self._optional = set(optional)
    self._saver = tf.compat.v1.train.Saver(var_list, max_to_keep=2,
                                           save_relative_paths=True)
    self._damaged = set(damaged)
    # A save killed half-way (SIGKILL, a machine lost) left these; this
    # process holds the directory's lock, so no other save is under way.
    _remove_temporary_files(save_path)
    # The rotation goes on from the checkpoints already there, so that a
    # resumed run keeps them in the pointer and removes them in turn.
    self._saver.recover_last_checkpoints([
        p for p in reversed(candidates(save_path)) if p not in self._damaged])

  def newest(self):
    """The newest checkpoint of the rotation (saved here, or found at the
    start and not damaged), or None."""
    return (self._saver.last_checkpoints or [None])[-1]

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

  def check_compatible(self, ckpt, fresh=()):
    """Raises UserError naming the first variable whose shape differs.

    Args:
      ckpt: the checkpoint.
      fresh: names of variables that are not restored (nor their other
        towers'), left out of the comparison.

    Returns:
      The names of the optional variables that `ckpt` lacks.
    """
    shapes = tf.train.load_checkpoint(ckpt).get_variable_to_shape_map()
    ours = {v.op.name: v.shape.as_list() for v in self._var_list}
    lacking = sorted(self._optional & set(ours) - set(shapes))
    one_sided = self._optional - (set(ours) & set(shapes))
    skipped = {_kind(name) for name in fresh}
    for name in sorted((set(shapes) | set(ours)) - one_sided):
      theirs, here = shapes.get(name), ours.get(name)
      if theirs != here and _kind(name) not in skipped:
        raise UserError(
            "--save_path=%s holds a checkpoint of another configuration: %s "
            "is %s there and %s here (hidden_size, num_layers and vocab_size "
            "must match, and in the middle of an epoch batch_size and the "
            "number of towers); use another --save_path" % (
                self._save_path, name,
                "absent" if theirs is None else theirs,
                "absent" if here is None else here))
    return lacking

  def restore(self, session, ckpt, fresh=(), warn=None):
    """Restores `ckpt` after checking that it fits this graph.

    Args:
      session: the session.
      ckpt: the checkpoint.
      fresh: variables of var_list that keep their initial values instead.
      warn: told the names of the optional variables that `ckpt` lacks,
        which are initialised instead.
    """
    fresh_names = {v.op.name for v in fresh}
    lacking = self.check_compatible(ckpt, fresh_names)
    skipped = fresh_names | set(lacking)
    tf.compat.v1.train.Saver(
        [v for v in self._var_list if v.op.name not in skipped]).restore(
            session, ckpt)
    session.run([v.initializer for v in self._var_list
                 if v.op.name in skipped])
    if lacking and warn:
      warn("%s has no %s (written without dropout, or by an older version): "
           "they start afresh, so from here the run differs from an "
           "uninterrupted one"
           % (ckpt, ", ".join(lacking)))

  def save(self, session, global_step):
    """Writes a checkpoint named for the global step; returns its path.

    Saver writes into temporary files and renames them, and moves the
    `checkpoint` pointer only afterwards: a crash or a full disk mid-save
    leaves the previous checkpoint usable. That holds only for a new name
    (a rewrite cut short would leave new data under the old index), so a
    second save of one step (an epoch's end after a run stopped in its
    validation pass) takes another, and so does a new checkpoint of the step
    of a damaged one, whose files are kept.

    Raises:
      SaveFailed: the save failed; it gives the operating system's reason
        and names the last good checkpoint.
    """
    prefix = os.path.join(self._save_path, "model.ckpt-%d" % (
        tf.compat.v1.train.global_step(session, global_step)))
    taken = self._damaged | set(self._saver.last_checkpoints)
    while prefix in taken:
      prefix += "r"
    try:
      # No meta graph: a resume rebuilds the graph from the code, and the
      # graph's constants hold the whole training corpus.
      return self._saver.save(session, prefix, write_meta_graph=False)
    # Saver raises ValueError when the directory has gone.
    except (tf.errors.OpError, OSError, ValueError) as e:
      reason = write_failure(e, self._save_path)
    _remove_temporary_files(*os.path.split(prefix))
    try:
      last = newest_readable(self._save_path)[0]
    except UserError:
      last = None
    raise SaveFailed("saving a checkpoint to %s failed (%s); the last good "
                     "checkpoint is %s" % (self._save_path, reason,
                                           last or "none: nothing was saved"),
                     prefix, last)

  def set_aside(self, paths):
    """Takes the checkpoints `paths` out of the run, keeping their files.

    Their files are renamed `diverged-NAME...`, which neither a resume nor
    the pointer's rotation ever picks, and the `checkpoint` pointer lists
    the others.

    Returns:
      The newest checkpoint left, or None.
    """
    for path in paths:
      directory, name = os.path.split(path)
      for entry in os.listdir(directory):
        if entry.startswith(name + "."):
          os.replace(os.path.join(directory, entry),
                     os.path.join(directory, DIVERGED_PREFIX + entry))
    left = [p for p in reversed(candidates(self._save_path))
            if p not in paths]  # oldest first
    if left:
      tf.compat.v1.train.update_checkpoint_state(
          self._save_path, os.path.basename(left[-1]),
          [os.path.basename(p) for p in left])
    elif os.path.exists(os.path.join(self._save_path, "checkpoint")):
      os.remove(os.path.join(self._save_path, "checkpoint"))
    return left[-1] if left else None
