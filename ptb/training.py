"""The pieces around ptb_word_lm.main's training loop.

main builds the models, opens the session and runs the epochs itself; this
module gives it the rest as small helpers: where a run resumes, the
graph's placement and the session of a cluster, the memory log, the run's
progress and checkpoints (RunState), what each finished epoch records
(EpochLog), and how a failure ends the summary. What happens at
every session call is in ptb/watch.py. Nothing here reads flags, and
nothing calls back into ptb_word_lm.
"""

import contextlib
import time

import numpy as np
import tensorflow as tf

from ptb import checkpoint as checkpoint_lib
from ptb import cluster as cluster_lib
from ptb import devices as devices_lib
from ptb import dropout
from ptb import monitor
from ptb import original_checkpoint
from ptb import resume as resume_lib
from ptb import tensorboard
from ptb.checkpoint import Checkpointer
from ptb.checkpoint import Progress
from ptb.checkpoint import SaveFailed
from ptb.errors import Stop
from ptb.errors import UserError
from ptb.errors import warn


def replica(cluster):
  """(this worker's index, workers) of a cluster; (0, 1) for one process."""
  if cluster is None:
    return 0, 1
  return cluster.task_index, len(cluster.worker_hosts)


def is_chief(cluster):
  """Whether this process initialises, validates, tests and saves."""
  return cluster is None or cluster_lib.is_chief(cluster)


# The flags a run's checkpoints record, as resume.record takes them.
RECORDED_FLAGS = ("train_from_zero_state", "use_bf16", "original_norm_threads")


def run_record(config, devices, cluster, **flag_values):
  """What the run's checkpoints record of it (resume.record); flag_values
  are those of RECORDED_FLAGS (unset: as before the flag existed)."""
  return resume_lib.record(config, len(devices), replica(cluster)[1],
                           **flag_values)


def find_resume(save_path, record, cluster):
  """The checkpoint the run resumes from, as a resume.Resume; None if none.

  Called before anything is written: a checkpoint that this config cannot
  continue is refused here (resume.find). Only the chief of a cluster
  restores; the other workers get None.
  """
  if not save_path or not is_chief(cluster):
    return None
  return resume_lib.find(save_path, record, restart_epoch=cluster is not None)


@contextlib.contextmanager
def memory_log(path, interval, devices, save_path=None):
  """Samples the memory into the CSV `path` while the block runs.

  A run that will resume from a checkpoint in `save_path` appends to the
  log it finds at `path`, so the log holds the whole run.

  Yields:
    The monitor.MemorySampler, or None without `path`.
  """
  if not path:
    yield None
    return
  gpus = [d.replace("/gpu", "GPU") for d in devices if d.startswith("/gpu")]
  sampler = monitor.MemorySampler(
      path, interval, gpu_memory_fn=tf.config.experimental.get_memory_info,
      gpu_names=gpus, append=bool(checkpoint_lib.candidates(save_path)))
  with sampler:
    yield sampler


def placement(cluster):
  """The device scope of a cluster's graph: variables on the ps tasks."""
  return tf.compat.v1.device(
      cluster_lib.device_setter(cluster) if cluster else None)


def open_session(graph, devices, intra_op_threads, inter_op_threads,
                 cluster=None, cluster_timeout=None):
  """A session of `graph`, to use in a `with`; a worker's once the ps are up.

  A worker's session closes without waiting for a lost task, and a call
  that fails outside summarize_failures (at the start, or the last call)
  ends the run with the same line (cluster_lib.worker_session).
  """
  config = devices_lib.session_config(devices, intra_op_threads,
                                      inter_op_threads)
  if not cluster:
    return tf.compat.v1.Session(graph=graph, config=config)
  server = cluster_lib.start_server(cluster)
  cluster_lib.wait_for(cluster.ps_hosts, "ps", cluster_timeout)
  config = cluster_lib.session_config(cluster, config, cluster_timeout)
  return cluster_lib.worker_session(server, cluster, config, graph,
                                    cluster_timeout)


class RunState(object):
  """A run's progress variables, its start and its checkpoints.

  Built in the run's graph after the models. Every checkpoint carries the
  progress (checkpoint.Progress) and, so that a run resumed mid-epoch
  continues exactly where it stopped, the training pass's LSTM state and
  data position. A failed save costs a warning, not the run: save_failure
  keeps the last one's reason.

  A checkpoint is known to be sound only once a session call has computed
  a cost from its weights: a step that blows the weights up saves them
  before any cost shows it. Until then it is unconfirmed, and a run that
  diverges sets its unconfirmed checkpoints aside (set_aside_unconfirmed),
  so that the newest sound one is what a resume finds. The rotation keeps
  two checkpoints, and every save after the first follows a call that
  judged the one before (the global step names them): the newest sound
  checkpoint is never rotated out by an unconfirmed one.

  Attributes:
    saving: whether this process writes checkpoints (a --save_path, and the
      chief of a cluster).
    save_path: the --save_path, or None.
    save_failure: the last save's SaveFailed, or None if it succeeded.
  """

  def __init__(self, save_path, model, resume, summary, record, cluster=None,
               cluster_timeout=None, init_from=None):
    """Creates the variables and ops of the run's start and saves.

    Args:
      save_path: the --save_path, or None.
      model: the training PTBModel.
      resume: find_resume's resume.Resume, or None.
      summary: the run's summary.Summary, rewritten after every save.
      record: run_record of the run.
      cluster: the cluster.Cluster of this worker, or None.
      cluster_timeout: seconds a worker waits for the chief to initialise.
      init_from: a checkpoint whose weights the variables start from
        (--init_from, checked), or None.
    """
    self.save_path = save_path
    self.save_failure = None
    self._model = model
    self._resume = resume
    self._summary = summary
    self._cluster = cluster
    self._cluster_timeout = cluster_timeout
    self._chief = is_chief(cluster)
    self._progress = Progress(record)
    self._global_step = tf.compat.v1.train.get_global_step()
    self._weights_finite = tf.reduce_all([
        tf.reduce_all(tf.math.is_finite(v))
        for v in tf.compat.v1.trainable_variables()])
    if init_from:  # the weights' initial values, before the initializer
      original_checkpoint.init_from(init_from,
                                    tf.compat.v1.trainable_variables())
    self._global_init = tf.compat.v1.global_variables_initializer()
    self._local_init = tf.compat.v1.local_variables_initializer()
    self._checkpointer = None
    self._unconfirmed = []  # checkpoints no session call has judged yet
    self.saving = bool(save_path) and self._chief
    if self.saving:
      Checkpointer.check_writable(save_path)
      self._checkpointer = Checkpointer(
          save_path, tf.compat.v1.global_variables() + self._pass_variables(),
          optional=dropout.SEED_VARIABLES,
          damaged=resume.damaged if resume else ())

  def _pass_variables(self):
    """The training pass's LSTM state and data position."""
    return self._model.state_variables + [self._model.input.position]

  def initialize(self, session):
    """Initialises the variables, or restores the checkpoint resumed.

    Returns:
      (epoch, start): the epoch (from 0) to start with, and run_epoch's
      `start` for its training pass, (step, costs) to continue it part-way,
      or None.
    """
    resume = self._resume
    if not self._chief:
      self._wait_for_chief(session)
      # A cluster saves only at an epoch's end.
      return self._progress.get(session)[0], None
    if not resume:
      session.run([self._global_init, self._local_init])
      return 0, None
    # Restoring initialises the variables: other workers wait for exactly
    # that, so they never see freshly initialised weights.
    session.run(self._local_init)
    self._checkpointer.restore(session, resume.ckpt, self._fresh(), warn)
    # Written by a process that may have stopped before judging it.
    self._unconfirmed = [resume.ckpt]
    print("Resuming from epoch %d step %d of %s"
          % (resume.epoch + 1, resume.step, self.save_path), flush=True)
    for line in resume.lines():
      print(line, flush=True)
    self._summary.resume(resume.epoch, resume.step, resume.summary_changes())
    return resume.epoch, ((resume.step, resume.costs) if resume.step
                          else None)

  def _fresh(self):
    """The variables that a restore leaves at their initial values.

    The config recorded is always this run's. Unless the run continues an
    epoch part-way, the training pass's LSTM state and data position start
    at zero, as at any epoch's start (their checkpoint's may be of another
    num_steps, batch_size or split of the rows).
    """
    fresh = [self._progress.config]
    if not self._resume.mid_epoch:
      fresh += self._pass_variables()
    return fresh

  def _wait_for_chief(self, session):
    deadline = time.time() + self._cluster_timeout
    with session.graph.as_default():
      uninitialized = tf.compat.v1.report_uninitialized_variables(
          tf.compat.v1.global_variables())
    while len(session.run(uninitialized)):
      if time.time() > deadline:
        raise UserError("worker %d: the chief (worker 0) did not initialise "
                        "the variables within %.0f s"
                        % (self._cluster.task_index, self._cluster_timeout))
      time.sleep(0.5)
    session.run(self._local_init)

  def save(self, session, epoch, step, costs):
    """Records the progress and writes a checkpoint; returns its path.

    Args:
      session: the run's session.
      epoch, step, costs: the progress (checkpoint.Progress): epochs done,
        and the training calls done in the next one and their summed cost.

    Returns:
      The checkpoint's path, or None if it could not be written
      (save_failure says why); the summary is written all the same.

    Raises:
      UserError: the weights are not finite.
    """
    # A finite cost does not prove that the update after it was finite.
    if not session.run(self._weights_finite):
      raise self.diverged("in epoch %d: the weights are not finite"
                          % (epoch + 1 if step else epoch))
    self._progress.set(session, epoch, step, costs)
    # The summary first: at every instant it holds each epoch that a
    # checkpoint records as done (a resume drops those that the checkpoint
    # it continues from has not done).
    self._summary.publish("running")
    return self.write(session)

  def save_and_go_on(self, session, epoch, step, costs):
    """Saves; a failed save costs nothing more than a warning.

    The warning gives the reason and the last good checkpoint; the training
    goes on, and the next save tries again.
    """
    if self.save(session, epoch, step, costs) is None:
      warn("%s; the training goes on, and the next save tries again"
           % self.save_failure)

  def write(self, session):
    """Writes a checkpoint; returns its path, or None and sets save_failure."""
    try:
      path = self._checkpointer.save(session, self._global_step)
    except SaveFailed as e:
      self.save_failure = e
      return None
    self.save_failure = None
    if path not in self._unconfirmed:
      self._unconfirmed.append(path)
    return path

  def finish(self, session):
    """The checkpoint of the run's end, written only if no save holds it.

    The last epoch's save does, or, in a run resumed after its last epoch,
    the checkpoint resumed: the test pass changes nothing a checkpoint
    holds. Returns its path, or None (save_failure says why).
    """
    newest = self._checkpointer.newest()
    if newest is not None and self.save_failure is None:
      return newest
    return self.write(session)

  def diverged(self, what):
    """The error that ends a diverged run, once its unconfirmed checkpoints
    are set aside; `what` says where and how it diverged."""
    aside, left = self.set_aside_unconfirmed()
    if not self.saving:
      kept = "nothing was saved"
    elif left:
      kept = "the last good checkpoint, %s, is kept" % left
    else:
      kept = "no good checkpoint is left in %s" % self.save_path
    if aside:
      kept = ("%s, saved from weights that no cost had yet shown sound, %s "
              "set aside as %s...; %s" % (
                  ", ".join(aside), "is" if len(aside) == 1 else "are",
                  checkpoint_lib.DIVERGED_PREFIX + "*", kept))
    return UserError("training diverged %s; %s" % (what, kept))

  def confirm(self):
    """A session call computed a sound cost from the weights saved last."""
    self._unconfirmed = []

  def set_aside_unconfirmed(self):
    """Sets aside the checkpoints no sound cost has confirmed (see above).

    Returns:
      (the checkpoints set aside, the newest one left or None).
    """
    if not self.saving:
      return [], None
    aside, self._unconfirmed = self._unconfirmed, []
    if not aside:
      return [], checkpoint_lib.newest_readable(self.save_path)[0]
    return aside, self._checkpointer.set_aside(aside)

  def global_step(self, session):
    return session.run(self._global_step)

  def check_saved(self):
    """Ends with an error a finished run whose last save failed.

    Raises:
      UserError: the last checkpoint is older than the run's end.
    """
    if self.save_failure is not None:
      raise UserError("the run is finished, but its end is not saved: %s"
                      % self.save_failure)


class EpochLog(object):
  """What each finished epoch leaves behind.

  Its record in the summary, then a checkpoint (which rewrites the summary;
  without checkpoints, the summary is rewritten alone), and its TensorBoard
  scalars.
  """

  def __init__(self, summary, checkpoints, watch, num_steps, workers=1,
               cluster=False):
    """Records epochs; with checkpoints, creates the TensorBoard file.

    Args:
      summary: the run's summary.Summary.
      checkpoints: the run's RunState, initialised (a refused
        checkpoint leaves the directory exactly as it was).
      watch: the run's watch.Watch, which timed the passes.
      num_steps: the training config's num_steps (the scalars' losses are
        per window).
      workers: the processes that train together.
      cluster: whether they are a cluster's (print_cluster_speed prints).
    """
    self._cluster = cluster
    self._summary = summary
    self._checkpoints = checkpoints
    self._watch = watch
    self._num_steps = num_steps
    self._workers = workers
    self._writer = (tensorboard.ScalarWriter(checkpoints.save_path)
                    if checkpoints.saving else None)

  def train_wps(self):
    """The last training pass's words a second, over all workers (None:
    no call of it in this process)."""
    wps = self._watch.train_wps()
    return None if wps is None else wps * self._workers

  def print_cluster_speed(self, epoch):
    """In a cluster, the training pass's speed over all its workers."""
    if self._cluster and self.train_wps() is not None:
      print("Epoch: %d Cluster speed: %.0f wps" % (epoch, self.train_wps()))

  def add(self, session, epoch, learning_rate, train_perplexity,
          valid_perplexity):
    """Records the finished epoch `epoch` (from 1), saves, writes scalars."""
    # Recorded before the save, which rewrites the summary: the epochs it
    # holds are then those the checkpoint has finished.
    self._summary.add_epoch({
        "epoch": epoch, "learning_rate": learning_rate,
        "train_perplexity": float(train_perplexity),
        "valid_perplexity": float(valid_perplexity),
        "train_wps": self.train_wps(),
        "train_seconds": self._watch.seconds("train"),
        "train_calls": self._watch.train_calls(),
        "valid_seconds": self._watch.seconds("valid")})
    if self._checkpoints.saving:
      self._checkpoints.save_and_go_on(session, epoch, 0, 0.0)
    else:
      self._summary.publish("running")
    if self._writer:
      self._writer.add(self._checkpoints.global_step(session), {
          "Training Loss": np.log(train_perplexity) * self._num_steps,
          "Learning Rate": learning_rate,
          "Validation Loss": np.log(valid_perplexity) * self._num_steps})

  def close(self):
    if self._writer:
      self._writer.close()


@contextlib.contextmanager
def summarize_failures(summary, where, cluster=None, cluster_timeout=None):
  """Ends the summary as the run ends when the block raises.

  A Stop (an error, an interrupt) is recorded as "failed" or "interrupted".
  In a cluster, a failed session call means that another task stopped or
  hung: it becomes cluster_lib.lost's UserError, which says where (`where`,
  a watch.Where) and names the task lost.
  """
  try:
    yield
  except Stop as e:
    summary.publish("failed" if isinstance(e, UserError) else "interrupted")
    raise
  except tf.errors.OpError as e:
    if not cluster:
      raise
    summary.publish("failed")
    raise cluster_lib.lost(
        cluster, e, cluster_timeout,
        " in the %s pass of epoch %d" % (where.phase, where.epoch)) from None


def print_peak_memory(devices):
  """Prints the process's peak RSS, and each GPU's peak memory."""
  print("Peak RSS: %.0f MiB" % monitor.peak_rss_mib())
  for device in devices:
    if device.startswith("/gpu"):
      name = "GPU:%s" % device.split(":")[-1]
      peak = tf.config.experimental.get_memory_info(name)["peak"]
      print("Peak GPU memory: %.0f MiB (%s)" % (peak / 2**20, name))
