"""What happens after every session call of a run: ptb_word_lm.main's on_step.

The training loop gives run_epoch `on_step=watch.begin(phase, epoch)`;
after each call the Watch records where the run is, stops the run on a
signal (saving first) or on a diverged cost, and saves every
--save_every_steps training calls.
"""

import dataclasses
import signal
import time

import numpy as np

from ptb import cluster as cluster_lib
from ptb import errors
from ptb import monitor
from ptb.errors import Stop

# A training call whose loss exceeds this many nats a word has diverged: the
# model gives the right word a probability below e^-1000, where guessing
# uniformly among even a million words costs 14 nats.
DIVERGED_NATS_PER_WORD = 1000.0


class SignalCatcher(object):
  """Turns SIGINT/SIGTERM into a flag that the training loop polls.

  A signal never interrupts a session call or a checkpoint write half-way:
  the loop notices it after the step, saves, and stops.
  """

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self):
    self.signum = None
    self._previous = {}

  def _handle(self, signum, _):
    self.signum = signum

  def __enter__(self):
    if errors.signal_seen() is not None:
      # A signal of start-up that a library swallowed ends the run here.
      raise errors.Interrupted()
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    errors.set_signal_phase("while finishing the run")


@dataclasses.dataclass
class Where(object):
  """Where the run is, for the memory log and the messages that stop it.

  Attributes:
    phase: "startup", then the pass: "train", "valid" or "test".
    epoch: the pass's epoch, from 1 (0 at startup).
    step: the pass's last session call done, from 0.
    costs: the summed cost of the pass's calls so far.
    train_costs: in a valid pass, the summed cost of the training pass
      before it.
  """
  phase: str = "startup"
  epoch: int = 0
  step: int = 0
  costs: float = 0.0
  train_costs: float = 0.0


class Watch(object):
  """Watches every session call of a run's passes, and times the passes.

  Attributes:
    where: the run's Where.
  """

  def __init__(self, session, signals, checkpoints, train_input, sampler=None,
               save_every_steps=0, cluster=None, window_taker=None):
    """A watch of the run in `session`.

    Args:
      session: the run's session.
      signals: the run's SignalCatcher.
      checkpoints: the run's training.RunState.
      train_input: the training model's PTBInput.
      sampler: the monitor.MemorySampler of --memory_log, or None.
      save_every_steps: save every this many training calls; 0 never.
      cluster: the cluster.Cluster of this worker, or None.
      window_taker: a summary_thread.WindowTaker, called before the first
        pass and after every call, or None.
    """
    self.where = Where()
    self._session = session
    self._signals = signals
    self._checkpoints = checkpoints
    self._train_input = train_input
    self._sampler = sampler
    self._save_every_steps = save_every_steps
    self._cluster = cluster
    self._window_taker = window_taker or (lambda session: None)
    self._first_calls_done = set()  # phases whose first call has run
    self._began = {}    # phase: when its last pass began
    self._seconds = {}  # phase: its last pass's seconds, to its last call
    self._train_start = 0  # the first call of the last training pass

  def begin(self, phase, epoch, start=None):
    """Starts watching a pass; returns the `on_step` to give run_epoch.

    Args:
      phase: "train", "valid" or "test".
      epoch: the pass's epoch, from 1 (the last epoch for the test).
      start: run_epoch's `start` of a training pass that continues
        part-way, or None.
    """
    where = self.where
    if not self._began:  # the run's first pass
      self._window_taker(self._session)
    if phase == "valid":
      where.train_costs = where.costs
    where.phase, where.epoch, where.step = phase, epoch, 0
    where.costs = start[1] if start else 0.0
    if phase == "train":
      self._train_start = start[0] if start else 0
    self._began[phase] = time.time()
    self._seconds[phase] = 0.0
    return self.on_step

  def seconds(self, phase):
    """How long the last pass of `phase` took."""
    return self._seconds[phase]

  def train_calls(self):
    """The session calls of the last training pass made in this process."""
    return self._train_input.num_calls - self._train_start

  def train_wps(self):
    """Words a second of the last training pass, in this process; None if
    it made none of the pass's calls (resumed after them)."""
    data = self._train_input
    words = (self.train_calls() * data.batch_size * data.num_towers *
             data.num_steps)
    seconds = self._seconds["train"]
    return words / seconds if words and seconds else None

  def on_step(self, step, cost, costs):
    """Called by run_epoch after every session call (its `on_step`).

    Raises:
      Stop: a signal came (after the save it makes); UserError: the
        training diverged (checkpoints.diverged).
    """
    where = self.where
    where.step, where.costs = step, costs
    self._window_taker(self._session)
    self._seconds[where.phase] = time.time() - self._began[where.phase]
    if self._sampler is not None:
      self._sampler.set_phase(where.phase, where.epoch, step)
    if where.phase not in self._first_calls_done:
      # A graph's first call optimised it and built its kernels, code that
      # later calls never run again.
      self._first_calls_done.add(where.phase)
      monitor.release_library_pages()
    checkpoints = self._checkpoints
    if where.phase == "train":
      # The cost comes from the weights before this call's update: those of
      # the last checkpoint, if no call ran since it was saved.
      if not self._sound(cost):
        raise checkpoints.diverged("at epoch %d step %d: the cost is %s"
                                   % (where.epoch, step + 1, cost))
      checkpoints.confirm()
    if self._signals.signum is not None:
      raise self._interrupted(self._signals.signum)
    if where.phase != "train":
      return
    every = self._save_every_steps
    if checkpoints.saving and every and (step + 1) % every == 0:
      checkpoints.save_and_go_on(self._session, where.epoch - 1, step + 1,
                                 costs)

  def _sound(self, cost):
    """Whether a training call's cost is finite and not absurdly high."""
    return (np.isfinite(cost) and
            cost <= DIVERGED_NATS_PER_WORD * self._train_input.num_steps)

  def _interrupted(self, signum):
    """Saves where a resume can continue; the Stop that says what is left."""
    where, checkpoints = self.where, self._checkpoints
    resume = "; run the same command to resume"
    if not checkpoints.saving and (
        self._cluster is None or cluster_lib.is_chief(self._cluster)):
      saved, resume = ("nothing saved: without --save_path a run cannot be "
                       "resumed; add --save_path=DIR to make the next run "
                       "resumable"), ""
    elif not checkpoints.saving:
      saved = "nothing saved here: only the chief saves"
    elif where.phase == "train" and not self._cluster:
      saved = self._saved(checkpoints.save(
          self._session, where.epoch - 1, where.step + 1, where.costs))
    elif where.phase == "valid" and not self._cluster:
      saved = self._saved(checkpoints.save(
          self._session, where.epoch - 1, self._train_input.num_calls,
          where.train_costs))
    elif where.phase == "test" and not self._cluster:
      # The last epoch's checkpoint holds the run (a test changes nothing
      # saved); written again only where its save failed.
      saved = self._saved(checkpoints.finish(self._session))
    else:
      # Workers of a cluster resume together only from an epoch's end.
      saved = "the checkpoint of the last finished epoch is in %s" % (
          checkpoints.save_path)
    if checkpoints.save_failure and not checkpoints.save_failure.last:
      resume = ""
    return Stop("interrupted by %s in the %s pass of epoch %d at step %d (%s)%s"
                % (signal.Signals(signum).name, where.phase, where.epoch,
                   where.step, saved, resume), 128 + signum)

  def _saved(self, path):
    """What an interrupt's save left: `path`, or the failure's account."""
    return ("checkpoint saved to %s" % path if path else
            str(self._checkpoints.save_failure))
