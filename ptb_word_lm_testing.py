"""Helpers of the tests that build ptb_word_lm's models or run its main.

They import ptb_word_lm, which the package's own helpers (ptb/testing.py)
never do. Nothing here is used by a training run.
"""

import contextlib
import io
import os
import signal
import sys
import tempfile
from unittest import mock

from absl.testing import flagsaver
import tensorflow as tf

from ptb import config as config_lib
from ptb import outputs
from ptb import plan as plan_lib
from ptb import testing
from ptb.errors import Stop
import ptb_word_lm


def learning_config(overrides=""):
  """--model=test with testing.LEARNING_OVERRIDES, then `overrides`, BASIC."""
  config = ptb_word_lm.get_config("test", "basic")
  config_lib.apply_overrides(config, ",".join(
      filter(None, [testing.LEARNING_OVERRIDES, overrides])))
  config_lib.validate_config(config)
  return config


def training_plan(config, chunk, limits=plan_lib.THRESHOLDS,
                  devices=("/cpu:0",)):
  """The plan.Step of training `config` here, its wavefront forced.

  Args:
    config: the config, its rnn_mode set.
    chunk: the wavefront's steps per chunk; None: one layer at a time.
    limits: the plan's other thresholds.
    devices: the towers.
  """
  return plan_lib.step(
      config, config.batch_size, config.num_steps, devices, tf.float32,
      plan_lib.offered(),
      limits=testing.wavefront_limits(chunk, config.hidden_size, limits))


def build_tiny_model(config, rows, rnn_mode, devices=("/cpu:0",),
                     is_training=True, seed=0, plan=None):
  """A model on fixed random data `rows` `[batch, steps + 1]` ids.

  `plan` (a plan.Step) forces its paths; None takes the plan's choices.
  """
  config.rnn_mode = rnn_mode
  data = rows.reshape(-1)  # rows are contiguous streams: see reader.
  input_ = ptb_word_lm.PTBInput(config, data, name="Input",
                                num_towers=len(devices))
  initializer = tf.compat.v1.random_uniform_initializer(
      -config.init_scale, config.init_scale, seed=seed)
  with tf.compat.v1.variable_scope("Model", initializer=initializer,
                                   reuse=tf.compat.v1.AUTO_REUSE):
    return ptb_word_lm.PTBModel(is_training, config, input_, devices=devices,
                                plan=plan)


def run_in_process(args, run_epoch=None):
  """Runs ptb_word_lm.main with the command line `args`, in this process.

  The run is the script's, but for the --save_path lock: that is held for
  the life of the process, and one test's process runs many times on one
  --save_path.

  Args:
    args: the flags, as ptb_word_lm.py takes them.
    run_epoch: a wrapper of ptb_word_lm.run_epoch that main calls instead
      during the run, or None.

  Returns:
    (stdout, stderr, the Stop that ended the run or None).
  """
  argv = ["ptb_word_lm.py"] + list(args)
  out, err, stop = io.StringIO(), io.StringIO(), None
  with contextlib.ExitStack() as stack:
    stack.enter_context(flagsaver.flagsaver())
    stack.enter_context(mock.patch.object(sys, "argv", argv))
    stack.enter_context(mock.patch.object(outputs, "lock"))
    if run_epoch is not None:
      stack.enter_context(
          mock.patch.object(ptb_word_lm, "run_epoch", run_epoch))
    stack.enter_context(contextlib.redirect_stdout(out))
    stack.enter_context(contextlib.redirect_stderr(err))
    ptb_word_lm.FLAGS(argv)
    try:
      ptb_word_lm.main(argv)
    except Stop as e:
      stop = e
  return out.getvalue(), err.getvalue(), stop


def without_plan(err):
  """A run's stderr without its `Plan: ...` line (plan_test checks that)."""
  return "".join(line for line in err.splitlines(keepends=True)
                 if not line.startswith("Plan: "))


def interrupting(step, signum=signal.SIGTERM):
  """ptb_word_lm.run_epoch that sends `signum` after training step `step`.

  The signal reaches this process once, in the first training pass that
  gets there; the run saves and stops as on a real one.
  """
  sent = []
  real_run_epoch = ptb_word_lm.run_epoch

  def run_epoch(session, model, eval_op=None, verbose=False, start=None,
                on_step=None):
    def step_done(done, cost, costs):
      if eval_op is not None and done == step and not sent:
        sent.append(signum)
        signal.raise_signal(signum)
      on_step(done, cost, costs)
    return real_run_epoch(session, model, eval_op, verbose, start, step_done)
  return run_epoch


class SavePathTest(tf.test.TestCase):
  """Tests with a temporary directory of their own.

  Attributes:
    tmp: the test's empty temporary directory, removed after it.
    save: a --save_path in it, not yet created.
  """

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.tmp = tmp.name
    self.save = os.path.join(tmp.name, "save")


class InProcessRunTest(SavePathTest):
  """Tests whose runs train in the test's process (run_in_process).

  Attributes:
    data: the directory of a make_structured_corpus of 300 lines: 67
      training steps an epoch with learning_args.
    save, summary: a --save_path and a --summary_json of the test's own.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._data_dir = tempfile.TemporaryDirectory()
    cls.data = testing.make_structured_corpus(cls._data_dir.name,
                                              train_lines=300)

  @classmethod
  def tearDownClass(cls):
    cls._data_dir.cleanup()
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.summary = os.path.join(self.tmp, "summary.json")

  def args(self, overrides=""):
    """learning_args on the corpus with `overrides`, saving to the test's."""
    return testing.learning_args(self.data, overrides) + [
        "--save_path=" + self.save, "--summary_json=" + self.summary]
