"""The training run: epochs, resume, signals, divergence guard.

ptb_word_lm.main hands TrainingRun plain values and its own build_models and
run_epoch; this module reads no flags.
"""

import signal
import time

import numpy as np
import tensorflow as tf

from ptb import checkpoint as checkpoint_lib
from ptb import cluster as cluster_lib
from ptb import devices as devices_lib
from ptb import dropout
from ptb import monitor
from ptb import resume as resume_lib
from ptb import summary as summary_lib
from ptb import tensorboard
from ptb.checkpoint import Checkpointer
from ptb.checkpoint import Progress
from ptb.checkpoint import SaveFailed
from ptb.errors import Stop
from ptb.errors import UserError
from ptb.errors import warn


def start_sampler(path, interval, devices, save_path=None):
  """Starts a MemorySampler writing `path` for `devices`; None without path.

  A run that will resume from a checkpoint in `save_path` appends to the
  log it finds at `path`, so the log holds the whole run.
  """
  if not path:
    return None
  gpus = [d.replace("/gpu", "GPU") for d in devices if d.startswith("/gpu")]
  sampler = monitor.MemorySampler(
      path, interval, gpu_memory_fn=tf.config.experimental.get_memory_info,
      gpu_names=gpus, append=bool(checkpoint_lib.candidates(save_path)))
  sampler.start()
  return sampler


def run_record(config, devices, cluster):
  """What the run's checkpoints record of it (resume.record)."""
  workers = len(cluster.worker_hosts) if cluster else 1
  return resume_lib.record(config, len(devices), workers)


def find_resume(save_path, config, devices, cluster):
  """The checkpoint the run resumes from, as a resume.Resume; None if none.

  Called before anything is written: a checkpoint that this config cannot
  continue is refused here (resume.find). Only the chief of a cluster
  restores; the other workers get None.
  """
  if not save_path or (cluster and not cluster_lib.is_chief(cluster)):
    return None
  return resume_lib.find(save_path, run_record(config, devices, cluster),
                         restart_epoch=cluster is not None)


def epoch_learning_rate(config, epoch):
  """The learning rate of epoch `epoch` (from 0): decayed after max_epoch."""
  return config.learning_rate * config.lr_decay ** max(
      epoch + 1 - config.max_epoch, 0.0)


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
    for sig in self.SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class TrainingRun(object):
  """One run of the training loop: graph, session, checkpoints, signals.

  Single process by default. With a cluster (cluster.Cluster), this process
  is one worker of a synchronous data-parallel job: its graph puts the
  variables on the ps tasks; worker 0, the chief, initialises, restores,
  validates, tests and saves; every worker trains on its own rows and prints
  its progress lines.
  """

  def __init__(self, config, eval_config, data, devices, options,
               build_models, run_epoch):
    """Builds the graph of the run.

    Args:
      config, eval_config: the training and the test configs.
      data: (train_ids, valid_ids, test_ids).
      devices: training tower devices.
      options: dict of plain values from the flags (see ptb_word_lm.main).
      build_models: ptb_word_lm.build_models.
      run_epoch: ptb_word_lm.run_epoch.
    """
    self.config = config
    self.run_epoch = run_epoch
    self.options = options
    self.save_path = options["save_path"]
    self.resume = options.get("resume")
    self.save_failure = None   # the last save's SaveFailed, if it failed
    self.sampler = options.get("sampler")
    self.summary = summary_lib.Summary(
        options.get("summary_json"), options.get("argv", ()),
        options.get("model"), config, devices, options.get("start_time"))
    self.cluster = options.get("cluster")
    self.chief = self.cluster is None or cluster_lib.is_chief(self.cluster)
    self.devices = devices
    self.where = {"phase": "startup", "epoch": 0, "step": 0, "costs": 0.0}
    self.first_calls_done = set()  # phases whose first call has run
    replica = ((self.cluster.task_index, len(self.cluster.worker_hosts))
               if self.cluster else (0, 1))
    self.graph = tf.Graph()
    with self.graph.as_default(), tf.compat.v1.device(
        cluster_lib.device_setter(self.cluster) if self.cluster else None):
      if options["seed"] is not None:
        tf.compat.v1.set_random_seed(options["seed"])
      models = build_models(config, eval_config, data, devices,
                            options["use_fp16"], options["eval_unroll"],
                            replica)
      self.m, self.mvalid, self.mtest = (models["train"], models["valid"],
                                         models["test"])
      self.progress = Progress(run_record(config, devices, self.cluster))
      self.global_step = tf.compat.v1.train.get_global_step()
      self.weights_finite = tf.reduce_all([
          tf.reduce_all(tf.math.is_finite(v))
          for v in tf.compat.v1.trainable_variables()])
      self.global_init = tf.compat.v1.global_variables_initializer()
      self.local_init = tf.compat.v1.local_variables_initializer()
      self.done = cluster_lib.done_ops(self.cluster) if self.cluster else []
      self.checkpointer = None
      if self.save_path and self.chief:
        Checkpointer.check_writable(self.save_path)
        # The training pass's LSTM state and data position are saved too, so
        # a run resumed mid-epoch continues exactly where it stopped.
        self.checkpointer = Checkpointer(
            self.save_path, tf.compat.v1.global_variables() +
            self.m.state_variables + [self.m.input.position],
            optional=dropout.SEED_VARIABLES,
            damaged=self.resume.damaged if self.resume else ())

  def _session(self):
    config = devices_lib.session_config(
        self.devices, self.options["intra_op_threads"],
        self.options["inter_op_threads"])
    if not self.cluster:
      return tf.compat.v1.Session(graph=self.graph, config=config)
    timeout = self.options["cluster_timeout"]
    server = cluster_lib.start_server(self.cluster)
    cluster_lib.wait_for(self.cluster.ps_hosts, "ps", timeout)
    return tf.compat.v1.Session(
        server.target, graph=self.graph,
        config=cluster_lib.session_config(self.cluster, config, timeout))

  def _initialize(self, session):
    """Initialises or restores; returns (epoch, step, costs) to start from."""
    resume = self.resume
    if not self.chief:
      self._wait_for_chief(session)
      # A cluster saves only at an epoch's end.
      return self.progress.get(session)[0], 0, 0.0
    if not resume:
      session.run([self.global_init, self.local_init])
      return 0, 0, 0.0
    # Restoring initialises the variables: other workers wait for exactly
    # that, so they never see freshly initialised weights.
    session.run(self.local_init)
    self.checkpointer.restore(session, resume.ckpt, self._fresh(resume), warn)
    print("Resuming from epoch %d step %d of %s"
          % (resume.epoch + 1, resume.step, self.save_path), flush=True)
    for line in resume.lines():
      print(line, flush=True)
    self.summary.resume(resume.epoch, resume.step, resume.summary_changes())
    return resume.epoch, resume.step, resume.costs

  def _fresh(self, resume):
    """The variables that a restore leaves at their initial values.

    The config recorded is always this run's. Unless the run continues an
    epoch part-way, the training pass's LSTM state and data position start
    at zero, as at any epoch's start (their checkpoint's may be of another
    num_steps, batch_size or split of the rows).
    """
    fresh = [self.progress.config]
    if not resume.mid_epoch:
      fresh += self.m.state_variables + [self.m.input.position]
    return fresh

  def _wait_for_chief(self, session):
    deadline = time.time() + self.options["cluster_timeout"]
    with self.graph.as_default():
      uninitialized = tf.compat.v1.report_uninitialized_variables(
          tf.compat.v1.global_variables())
    while len(session.run(uninitialized)):
      if time.time() > deadline:
        raise UserError("worker %d: the chief (worker 0) did not initialise "
                        "the variables within %.0f s"
                        % (self.cluster.task_index,
                           self.options["cluster_timeout"]))
      time.sleep(0.5)
    session.run(self.local_init)

  def save(self, session, epoch, step, costs):
    """Records the progress and writes a checkpoint; returns its path.

    Returns None if the checkpoint could not be written (save_failure
    says why); the summary is written all the same.
    """
    # A finite cost does not prove that the update after it was finite.
    if not session.run(self.weights_finite):
      raise UserError("training diverged in epoch %d: the weights are not "
                      "finite; the last good checkpoint in %s is kept"
                      % (self.where["epoch"], self.save_path))
    self.progress.set(session, epoch, step, costs)
    path = self._write_checkpoint(session)
    # The summary's wall time then reaches the checkpoint that a resume
    # continues from.
    self.summary.publish("running")
    return path

  def _save_and_go_on(self, session, epoch, step, costs):
    """Saves; a failed save costs nothing more than a warning.

    The warning gives the reason and the last good checkpoint; the training
    goes on, and the next save tries again.
    """
    if self.save(session, epoch, step, costs) is None:
      warn("%s; the training goes on, and the next save tries again"
           % self.save_failure)

  def _write_checkpoint(self, session):
    """Writes a checkpoint; returns its path, or None and sets save_failure."""
    try:
      path = self.checkpointer.save(session, self.global_step)
    except SaveFailed as e:
      self.save_failure = e
      return None
    self.save_failure = None
    return path

  def _check_saved(self):
    """Ends with an error a finished run whose last save failed.

    Raises:
      UserError: the last checkpoint is older than the run's end.
    """
    failure = self.save_failure
    if failure is None:
      return
    if failure.last != failure.path:
      raise UserError("the run is finished, but its end is not saved: %s"
                      % failure)
    # The save after the test pass rewrites the last epoch's checkpoint.
    warn("%s, which holds this same step: the run's end is saved" % failure)

  def _interrupted(self, session, signum):
    where = self.where
    resume = "; run the same command to resume"
    if self.checkpointer is None and self.chief:
      saved, resume = ("nothing saved: without --save_path a run cannot be "
                       "resumed; add --save_path=DIR to make the next run "
                       "resumable"), ""
    elif self.checkpointer is None:
      saved = "nothing saved here: only the chief saves"
    elif where["phase"] == "train" and not self.cluster:
      saved = self._saved(self.save(
          session, where["epoch"] - 1, where["step"] + 1, where["costs"]))
    elif where["phase"] == "valid" and not self.cluster:
      saved = self._saved(self.save(
          session, where["epoch"] - 1, self.m.input.num_calls,
          where["train_costs"]))
    else:
      # Workers of a cluster resume together only from an epoch's end.
      saved = "the checkpoint of the last finished epoch is in %s" % (
          self.save_path)
    if self.save_failure and not self.save_failure.last:
      resume = ""
    return Stop("interrupted by %s in the %s pass of epoch %d at step %d (%s)%s"
                % (signal.Signals(signum).name, where["phase"], where["epoch"],
                   where["step"], saved, resume), 128 + signum)

  def _saved(self, path):
    """What an interrupt's save left: `path`, or the failure's account."""
    return ("checkpoint saved to %s" % path if path else
            str(self.save_failure))

  def _on_step(self, session, signals, step, cost, costs):
    where = self.where
    where["step"], where["costs"] = step, costs
    if self.sampler is not None:
      self.sampler.set_phase(where["phase"], where["epoch"], step)
    if where["phase"] not in self.first_calls_done:
      # A graph's first call optimised it and built its kernels, code that
      # later calls never run again.
      self.first_calls_done.add(where["phase"])
      monitor.release_library_pages()
    if signals.signum is not None:
      raise self._interrupted(session, signals.signum)
    if where["phase"] != "train":
      return
    if not np.isfinite(cost):
      raise UserError(
          "training diverged at epoch %d step %d: the cost is %s; %s"
          % (where["epoch"], step + 1, cost,
             "the last good checkpoint in %s is kept" % self.save_path
             if self.checkpointer else "nothing was saved"))
    every = self.options.get("save_every_steps")
    if self.checkpointer and every and (step + 1) % every == 0:
      self._save_and_go_on(session, where["epoch"] - 1, step + 1, costs)

  def _epoch(self, session, i, resume, on_step, writer):
    """Trains epoch i (from 0), validates on the chief; records it."""
    config, m = self.config, self.m
    epoch_start = time.time()
    lr = epoch_learning_rate(config, i)
    m.assign_lr(session, lr)
    print("Epoch: %d Learning rate: %.3f" % (i + 1, session.run(m.lr)))
    self.where.update(phase="train", epoch=i + 1, step=0, costs=0.0)
    train_perplexity = self.run_epoch(session, m, eval_op=m.train_op,
                                      verbose=True, start=resume,
                                      on_step=on_step)
    train_seconds = time.time() - epoch_start
    wps = _epoch_words(m, resume) / train_seconds
    print("Epoch: %d Train Perplexity: %.3f" % (i + 1, train_perplexity))
    if not self.chief:
      return
    if self.cluster:
      wps *= len(self.cluster.worker_hosts)
      print("Epoch: %d Cluster speed: %.0f wps" % (i + 1, wps))
    self.where.update(phase="valid", step=0,
                      train_costs=(np.log(train_perplexity) *
                                   m.input.epoch_size * m.input.num_steps))
    valid_start = time.time()
    valid_perplexity = self.run_epoch(session, self.mvalid, on_step=on_step)
    print("Epoch: %d Valid Perplexity: %.3f" % (i + 1, valid_perplexity))
    # Recorded before the save, which rewrites the summary: the epochs it
    # holds are then those the checkpoint has finished.
    self.summary.add_epoch({
        "epoch": i + 1, "learning_rate": lr,
        "train_perplexity": float(train_perplexity),
        "valid_perplexity": float(valid_perplexity),
        "train_wps": wps, "train_seconds": train_seconds,
        "valid_seconds": time.time() - valid_start})
    if self.checkpointer:
      self._save_and_go_on(session, i + 1, 0, 0.0)
    else:
      self.summary.publish("running")
    if writer:
      writer.add(session.run(self.global_step), {
          "Training Loss": np.log(train_perplexity) * config.num_steps,
          "Learning Rate": lr,
          "Validation Loss": np.log(valid_perplexity) * config.num_steps})

  def run(self):
    """Trains all epochs, tests; prints the SPEC lines."""
    with self._session() as session, SignalCatcher() as signals:
      first_epoch, first_step, first_costs = self._initialize(session)
      # Start-up is over; the library code it ran need not stay resident.
      monitor.release_library_pages()
      # Created only now, so that a refused checkpoint leaves the directory
      # exactly as it was.
      writer = (tensorboard.ScalarWriter(self.save_path)
                if self.checkpointer else None)

      def on_step(step, cost, costs):
        self._on_step(session, signals, step, cost, costs)

      try:
        for i in range(first_epoch, self.config.max_max_epoch):
          resume = ((first_step, first_costs)
                    if i == first_epoch and first_step else None)
          self._epoch(session, i, resume, on_step, writer)
        if self.chief:
          self.where.update(phase="test", epoch=self.config.max_max_epoch,
                            step=0)
          test_perplexity = self.run_epoch(session, self.mtest, on_step=on_step)
      except Stop as e:
        self.summary.publish(
            "failed" if isinstance(e, UserError) else "interrupted")
        raise
      except tf.errors.OpError as e:
        if not self.cluster:
          raise
        self.summary.publish("failed")
        raise UserError(
            "worker %d lost the cluster in the %s pass of epoch %d (%s: %s); "
            "a ps or worker task stopped, or made no progress within "
            "--cluster_timeout=%.0f s"
            % (self.cluster.task_index, self.where["phase"],
               self.where["epoch"], type(e).__name__,
               e.message.splitlines()[0] if e.message else "",
               self.options["cluster_timeout"])) from None
      if self.chief:
        print("Test Perplexity: %.3f" % test_perplexity)
        self.summary.fields["test_perplexity"] = float(test_perplexity)
      _print_peak_memory(self.devices)
      if self.checkpointer:
        print("Saving model to %s." % self.save_path)
        self._write_checkpoint(session)
      session.run(self.done)
      self.summary.publish("finished")
      if writer:
        writer.close()
    self._check_saved()


def _epoch_words(model, resume):
  """Words the training pass processed in this process (not before resume)."""
  data = model.input
  done = resume[0] if resume else 0
  return ((data.num_calls - done) * data.batch_size * data.num_towers *
          data.num_steps)


def _print_peak_memory(devices):
  print("Peak RSS: %.0f MiB" % monitor.peak_rss_mib())
  for device in devices:
    if device.startswith("/gpu"):
      name = "GPU:%s" % device.split(":")[-1]
      peak = tf.config.experimental.get_memory_info(name)["peak"]
      print("Peak GPU memory: %.0f MiB (%s)" % (peak / 2**20, name))
