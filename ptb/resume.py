"""What a resumed run may change from the config its checkpoint records.

Every checkpoint records the config it was trained with (record(), in the
variable checkpoint.CONFIG_VARIABLE), and a resume compares it with its own:

- hidden_size, num_layers and vocab_size shape the weights: a checkpoint of
  other values is another model's, and is refused.
- num_steps, batch_size, the split of the rows over towers and workers, and
  whether training carries its LSTM state (--train_from_zero_state) give
  the saved data position and LSTM state their meaning. They cannot
  change in the middle of an epoch. At an epoch's end they may: every
  epoch starts from the first window with a zero state. The products'
  dtype (--use_bf16) likewise, so that an epoch's perplexity is of one.
- The other fields (the schedule: max_max_epoch, max_epoch, learning_rate,
  lr_decay, keep_prob; and max_grad_norm, init_scale, rnn_mode, and how the
  clipping's norm is summed, --original_norm_threads) may change at any
  time.

The run names each change in one line, and the summary JSON records it.
"""

from ptb import checkpoint as checkpoint_lib
from ptb import config as config_lib
from ptb.errors import UserError
from ptb.errors import warn

# The fields that shape the weights.
WEIGHT_FIELDS = ("hidden_size", "num_layers", "vocab_size")
# The fields that the saved data position and LSTM state depend on.
POSITION_FIELDS = ("num_steps", "batch_size", "towers", "workers",
                   "train_from_zero_state", "use_bf16")
# How a run sets the fields that are no config fields.
_SET_BY = {"towers": "towers (--num_gpus, --cpu_towers)",
           "workers": "workers (--worker_hosts)",
           "train_from_zero_state": "--train_from_zero_state",
           "use_bf16": "--use_bf16"}
# What a checkpoint written before a field existed ran with.
_BEFORE_RECORDED = {"train_from_zero_state": False, "use_bf16": False,
                    "original_norm_threads": 0}
# How _listed writes a change in an error, and in the lines of a resume.
_BOTH = "{label} is {old} there and {new} here"
_WAS = "{name}={new} (was {old})"


def record(config, towers, workers, train_from_zero_state=False,
           use_bf16=False, original_norm_threads=0):
  """What a checkpoint records of its run: every config field, the split,
  whether training starts every step from a zero state, whether the
  products run in bfloat16, and the cores whose sum of the clipping norm
  it copies (0: the exact sum)."""
  fields = config_lib.config_fields(config)
  fields.update(towers=towers, workers=workers,
                train_from_zero_state=train_from_zero_state,
                use_bf16=use_bf16, original_norm_threads=original_norm_threads)
  return fields


def config_changes(saved, new):
  """{field: (saved value, new value)} for each field that differs."""
  saved = dict(_BEFORE_RECORDED, **saved)
  return {name: (saved.get(name), new.get(name))
          for name in sorted(set(saved) | set(new))
          if saved.get(name) != new.get(name)}


def _listed(changes, names, form):
  """The changes of `names`, each written as `form`, joined.

  `form` may use {name}, {label} (the name, with the flags that set it for
  a field that is no config field), {old} and {new}.
  """
  return ", ".join(form.format(name=name, label=_SET_BY.get(name, name),
                               old=changes[name][0], new=changes[name][1])
                   for name in names)


class Resume(object):
  """Where a run resumes, and what it changes from its checkpoint.

  Attributes:
    ckpt: the checkpoint.
    epoch, step, costs: its progress (checkpoint.Progress); step and costs
      are 0 where the epoch starts again.
    mid_epoch: whether the run continues an epoch part-way, from the saved
      data position and LSTM state.
    changes: config_changes from the checkpoint's record to this run's, or
      None where the checkpoint records no config.
    damaged: the newer checkpoints skipped, which cannot be read.
  """

  def __init__(self, ckpt, progress, changes, damaged):
    self.ckpt = ckpt
    self.epoch, self.step, self.costs = progress
    self.mid_epoch = self.step > 0
    self.changes = changes
    self.damaged = damaged

  def check(self, save_path):
    """Refuses changes that the checkpoint cannot continue with, in one line.

    Raises:
      UserError: a weight field changed; or a position field did, in the
        middle of an epoch.
    """
    changed = [n for n in WEIGHT_FIELDS if n in self.changes]
    if changed:
      raise UserError(
          "--save_path=%s holds a checkpoint of another configuration: %s; "
          "these shape the weights: set them back, or use another "
          "--save_path" % (save_path, _listed(self.changes, changed, _BOTH)))
    changed = [n for n in POSITION_FIELDS if n in self.changes]
    if changed and self.mid_epoch:
      raise UserError(
          "--save_path=%s holds a checkpoint from the middle of epoch %d "
          "(step %d), whose data position and LSTM state need the values it "
          "was trained with: %s; resume with those until epoch %d ends "
          "(max_max_epoch=%d in --config_overrides ends the run there), then "
          "change them" % (
              save_path, self.epoch + 1, self.step,
              _listed(self.changes, changed, _BOTH), self.epoch + 1,
              self.epoch + 1))

  def lines(self):
    """The lines that name the changes, to print after "Resuming from"."""
    if not self.changes:
      return []
    moved = [n for n in POSITION_FIELDS if n in self.changes]
    others = [n for n in self.changes if n not in moved]
    lines = []
    if moved:
      lines.append(
          "Config changes at the end of epoch %d: %s; the next epoch starts "
          "from the first window with a zero LSTM state, as every epoch does"
          % (self.epoch, _listed(self.changes, moved, _WAS)))
    if others:
      lines.append("Config changes since the checkpoint: %s"
                   % _listed(self.changes, others, _WAS))
    return lines

  def summary_changes(self):
    """The changes as the summary JSON records them; None if unknown."""
    if self.changes is None:
      return None
    return {name: {"from": old, "to": new}
            for name, (old, new) in self.changes.items()}


def find(save_path, run_record, restart_epoch=False):
  """The checkpoint a run resumes from, checked against its config.

  Args:
    save_path: the --save_path of the run.
    run_record: record() of the run.
    restart_epoch: the run starts the checkpoint's epoch again (a cluster
      continues only from an epoch's end).

  Returns:
    A Resume, or None where there is no checkpoint.

  Raises:
    UserError: no checkpoint can be read, or the newest readable one
      cannot be continued with this config (Resume.check).
  """
  ckpt, damaged = checkpoint_lib.newest_readable(save_path, warn)
  if ckpt is None:
    return None
  epoch, step, costs, saved = checkpoint_lib.read_progress(ckpt)
  if restart_epoch:
    step, costs = 0, 0.0
  resume = Resume(ckpt, (epoch, step, costs),
                  None if saved is None else config_changes(saved, run_record),
                  damaged)
  if saved is None:
    warn("the checkpoint %s records no config (written by an older "
         "version): only its variables' shapes are checked against this "
         "run's%s" % (ckpt, "; in the middle of epoch %d, its data position "
                      "is taken to count windows of this run's num_steps=%d"
                      % (epoch + 1, run_record["num_steps"])
                      if resume.mid_epoch else ""))
  else:
    resume.check(save_path)
  return resume
