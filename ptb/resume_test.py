"""What a resume may change from its checkpoint's config (resume.py).

The runs are ptb_word_lm.main's in this process, on a generated corpus that
needs the LSTM state carried; an interrupt is a real SIGTERM that the run
catches, saving its checkpoint in the middle of epoch 1. The checkpoints
that the tests resume are made once for the class, and copied.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
from unittest import mock

import tensorflow as tf

from ptb import checkpoint
from ptb import monitor
from ptb import resume as resume_lib
from ptb import tensorboard
from ptb import testing
from ptb import training
from ptb.errors import UserError
import ptb_word_lm
import ptb_word_lm_testing

# The step of epoch 1 (of 67) after which the interrupted runs stop.
STOP_STEP = 30


def perplexity_lines(out):
  """The run's Train, Valid and Test perplexity lines, as printed."""
  return re.findall(r"^(?:Epoch: \d+ (?:Train|Valid) |Test )Perplexity: .*$",
                    out, re.M)


def overridden(overrides=""):
  """The runs' overrides: with dropout, 2 epochs, then `overrides`."""
  return ",".join(filter(None, ["keep_prob=0.5,max_max_epoch=2", overrides]))


def config(overrides=""):
  """The runs' config: learning, overridden(overrides)."""
  return ptb_word_lm_testing.learning_config(overridden(overrides))


class Killed(BaseException):
  """What a kill leaves a process: nothing after it runs, nothing catches it."""


@contextlib.contextmanager
def killed_at_epoch_end(epoch, write):
  """The run in the block dies at the `write`-th write of `epoch`'s end.

  The writes of an epoch's end (training.EpochLog.add) are counted: the
  summary's, the checkpoint's and the TensorBoard scalars'. The process
  dies just before write number `write` (from 1), or just after the last
  one when `write` exceeds their number; from then on it writes nothing,
  as a killed process does not.

  Yields:
    The kinds of the writes counted at that epoch's end.
  """
  state = {"counting": False, "writes": [], "dead": False}

  def kill(where):
    state["dead"] = True
    raise Killed(where)

  def counted(kind, real):
    def write(*args, **kwargs):
      if state["dead"]:
        return None
      if state["counting"]:
        state["writes"].append(kind)
        if len(state["writes"]) == write_number:
          kill("before the %s write" % kind)
      return real(*args, **kwargs)
    return write

  write_number = write
  real_add = training.EpochLog.add

  def add(self, session, at, *args):
    state["counting"] = at == epoch
    real_add(self, session, at, *args)
    if state["counting"]:
      kill("after the epoch's writes")

  with mock.patch.object(monitor, "write_json_atomic",
                         counted("summary", monitor.write_json_atomic)), \
      mock.patch.object(checkpoint.Checkpointer, "save",
                        counted("checkpoint", checkpoint.Checkpointer.save)), \
      mock.patch.object(tensorboard.ScalarWriter, "add",
                        counted("scalars", tensorboard.ScalarWriter.add)), \
      mock.patch.object(training.EpochLog, "add", add):
    yield state["writes"]


class ResumeTest(ptb_word_lm_testing.InProcessRunTest):
  """Resumes of two checkpoints made once for the class, each test on a copy.

  Attributes:
    reference: the perplexity lines of the uninterrupted run.
    interrupted: the save_path and summary of a run stopped by SIGTERM
      after step STOP_STEP of epoch 1.
    finished: those of a run of one epoch: its last checkpoint is at epoch
      1's end.
    finished_test: that run's Test Perplexity line (BASIC, AUTO's mode here).
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    out, err, stop = ptb_word_lm_testing.run_in_process(
        testing.learning_args(cls.data, overridden()))
    assert stop is None, err
    cls.reference = perplexity_lines(out)
    cls._runs = tempfile.TemporaryDirectory()
    cls.interrupted, cls.finished = (
        (os.path.join(cls._runs.name, name, "save"),
         os.path.join(cls._runs.name, name, "summary.json"))
        for name in ("interrupted", "finished"))
    save, summary = cls.interrupted
    _, err, stop = ptb_word_lm_testing.run_in_process(
        testing.learning_args(cls.data, overridden()) +
        ["--save_path=" + save, "--summary_json=" + summary],
        ptb_word_lm_testing.interrupting(STOP_STEP))
    assert stop is not None and stop.exit_code == 143, err
    assert str(stop).endswith("(checkpoint saved to %s/model.ckpt-%d); run "
                              "the same command to resume"
                              % (save, STOP_STEP + 1)), stop
    save, summary = cls.finished
    out, err, stop = ptb_word_lm_testing.run_in_process(
        testing.learning_args(cls.data, overridden("max_max_epoch=1")) +
        ["--save_path=" + save, "--summary_json=" + summary])
    assert stop is None, err
    # Its epoch is the uninterrupted run's first.
    assert perplexity_lines(out)[:2] == cls.reference[:2], out
    cls.finished_test = perplexity_lines(out)[2]

  @classmethod
  def tearDownClass(cls):
    cls._runs.cleanup()
    super().tearDownClass()

  def run_training(self, overrides="", run_epoch=None):
    """A run on the test's save_path; returns (stdout, stderr, Stop).

    `run_epoch` replaces ptb_word_lm.run_epoch (None: it runs).
    """
    return ptb_word_lm_testing.run_in_process(
        self.args(overridden(overrides)), run_epoch)

  def copy_run(self, run):
    """Makes the class's `run` (save_path, summary) the test's own."""
    save, summary = run
    shutil.copytree(save, self.save)
    shutil.copy2(summary, self.summary)

  def interrupted_in_epoch_1(self):
    """The test's save_path holds the checkpoint saved after step STOP_STEP."""
    self.copy_run(self.interrupted)

  def finished_epoch_1(self):
    """The test's save_path holds a run of one epoch (max_max_epoch=1)."""
    self.copy_run(self.finished)

  def resumed(self, overrides="", run_epoch=None):
    """Runs again with `overrides`; returns its stdout, stderr must be empty."""
    out, err, stop = self.run_training(overrides, run_epoch)
    self.assertIsNone(stop, err)
    self.assertEqual(ptb_word_lm_testing.without_plan(err), "")
    return out

  def resumes_recorded(self):
    with open(self.summary) as f:
      return json.load(f)["resumes"]

  def testTheSameConfigContinuesExactly(self):
    self.interrupted_in_epoch_1()
    out = self.resumed()
    self.assertIn("Resuming from epoch 1 step %d of %s" % (STOP_STEP + 1,
                                                           self.save), out)
    self.assertNotIn("Config changes", out)
    self.assertEqual(perplexity_lines(out), self.reference)
    self.assertEqual(self.resumes_recorded()[-1]["config_changes"], {})

  def testScheduleChangesInAnEpochAreNamedAndRecorded(self):
    self.interrupted_in_epoch_1()
    out = self.resumed("learning_rate=0.5,keep_prob=1")
    self.assertIn("Config changes since the checkpoint: keep_prob=1.0 (was "
                  "0.5), learning_rate=0.5 (was 1.0)\n", out)
    self.assertIn("Epoch: 1 Learning rate: 0.500", out)
    self.assertEqual(self.resumes_recorded()[-1], {
        "epoch": 1, "step": STOP_STEP + 1,
        "wall_seconds": self.resumes_recorded()[-1]["wall_seconds"],
        "config_changes": {"keep_prob": {"from": 0.5, "to": 1.0},
                           "learning_rate": {"from": 1.0, "to": 0.5}}})

  def testScheduleChangeAtAnEpochsEndContinuesExactly(self):
    self.finished_epoch_1()
    out = self.resumed("max_max_epoch=2")
    self.assertIn("Resuming from epoch 2 step 0", out)
    self.assertIn("Config changes since the checkpoint: max_max_epoch=2 (was "
                  "1)\n", out)
    self.assertEqual(perplexity_lines(out), self.reference[2:])

  def testTheEndIsTheLastEpochsCheckpointNotWrittenAgain(self):
    self.finished_epoch_1()
    ckpt = tf.train.latest_checkpoint(self.save)
    mtime = os.path.getmtime(ckpt + ".index")
    out = self.resumed("max_max_epoch=1")  # straight to the test pass
    self.assertIn("Saving model to %s." % self.save, out)
    self.assertEqual(tf.train.latest_checkpoint(self.save), ckpt)
    self.assertEqual(os.path.getmtime(ckpt + ".index"), mtime)

  def testAStopInTheValidPassKeepsItsCheckpointAndSavesTheEndAnew(self):
    real_run_epoch = ptb_word_lm.run_epoch

    def stopped_in_valid_pass(session, model, eval_op=None, verbose=False,
                              start=None, on_step=None):
      def step_done(step, cost, costs):
        if eval_op is None and model.input.num_steps > 1 and step == 0:
          signal.raise_signal(signal.SIGTERM)
        on_step(step, cost, costs)
      return real_run_epoch(session, model, eval_op, verbose, start,
                            step_done)

    _, err, stop = self.run_training(run_epoch=stopped_in_valid_pass)
    self.assertEqual(stop.exit_code, 143, err)
    stopped = tf.train.latest_checkpoint(self.save)
    with open(stopped + ".index", "rb") as f:
      index = f.read()
    out = self.resumed("max_max_epoch=1")
    self.assertEqual(perplexity_lines(out), self.reference[:2] + [
        self.finished_test])
    # The epoch's end is the same global step: another name, the stopped
    # run's checkpoint untouched beside it.
    self.assertEqual(tf.train.latest_checkpoint(self.save), stopped + "r")
    with open(stopped + ".index", "rb") as f:
      self.assertEqual(f.read(), index)
    # Saved after epoch 1's training pass: at the step of its end.
    end = tf.train.latest_checkpoint(self.finished[0])
    self.assertEqual(os.path.basename(stopped), os.path.basename(end))
    self.assertEqual(checkpoint.read_progress(stopped)[:2],
                     (0, int(end.rsplit("-", 1)[1])))
    self.assertEqual(checkpoint.read_progress(stopped + "r")[:2], (1, 0))

  def testWhatAKilledSaveLeftIsRemovedAtTheNextStart(self):
    self.finished_epoch_1()
    left = ["model.ckpt-99.data-00000-of-00001.tempstate7",
            "model.ckpt-99.index.tempstate8", "checkpoint.tmp9"]
    for name in left:
      with open(os.path.join(self.save, name), "w") as f:
        f.write("a save cut short")
    out = self.resumed("max_max_epoch=2")
    self.assertEqual(perplexity_lines(out), self.reference[2:])
    self.assertEqual(set(left) & set(os.listdir(self.save)), set())

  def testACheckpointOfBasicEvaluatesInBlockWithTheSameNumbers(self):
    # BASIC and BLOCK share the variables and their layout (the SPEC).
    self.finished_epoch_1()
    out = self.resumed("max_max_epoch=1,rnn_mode=block")
    self.assertIn("Config changes since the checkpoint: rnn_mode=block (was "
                  "basic)\n", out)
    (line,) = perplexity_lines(out)
    self.assertRegex(line, r"^Test Perplexity: ")
    self.assertAllClose(float(line.split(": ")[1]),
                        float(self.finished_test.split(": ")[1]), rtol=1e-5)

  def testShapeChangeInAnEpochIsRefusedAndNothingWritten(self):
    self.interrupted_in_epoch_1()
    before = {n: os.path.getmtime(os.path.join(self.save, n))
              for n in os.listdir(self.save)}
    summary = os.path.getmtime(self.summary)
    # The command's config check comes first: it refuses before any write.
    with self.assertRaises(UserError) as e:
      training.find_resume(
          self.save, training.run_record(config("num_steps=3,batch_size=10"),
                                         ["/cpu:0"], None), None)
    self.assertEqual(
        str(e.exception),
        "--save_path=%s holds a checkpoint from the middle of epoch 1 (step "
        "%d), whose data position and LSTM state need the values it was "
        "trained with: num_steps is 2 there and 3 here, batch_size is 20 "
        "there and 10 here; resume with those until epoch 1 ends "
        "(max_max_epoch=1 in --config_overrides ends the run there), then "
        "change them" % (self.save, STOP_STEP + 1))
    self.assertEqual({n: os.path.getmtime(os.path.join(self.save, n))
                      for n in os.listdir(self.save)}, before)
    self.assertEqual(os.path.getmtime(self.summary), summary)

  def testShapeChangeAtAnEpochsEndStartsTheEpochAfresh(self):
    self.finished_epoch_1()
    positions = []
    real_run_epoch = ptb_word_lm.run_epoch

    def run_epoch(session, model, eval_op=None, **kwargs):
      if eval_op is not None:  # where the training pass starts
        positions.append(session.run(model.input.position))
      return real_run_epoch(session, model, eval_op, **kwargs)

    out = self.resumed("num_steps=3,batch_size=10", run_epoch)
    self.assertIn(
        "Config changes at the end of epoch 1: num_steps=3 (was 2), "
        "batch_size=10 (was 20); the next epoch starts from the first window "
        "with a zero LSTM state, as every epoch does\n", out)
    # The first window of the new size, not the old position's.
    self.assertEqual(positions, [0])
    self.assertRegex(out, r"Epoch: 2 Valid Perplexity: .*\nTest Perplexity")
    self.assertEqual(self.resumes_recorded()[-1]["config_changes"], {
        "batch_size": {"from": 20, "to": 10},
        "max_max_epoch": {"from": 1, "to": 2},
        "num_steps": {"from": 2, "to": 3}})

  def testTrainFromZeroStateChangesOnlyAtAnEpochsEnd(self):
    args = self.args(overridden()) + ["--train_from_zero_state"]
    self.interrupted_in_epoch_1()
    _, _, stop = ptb_word_lm_testing.run_in_process(args)
    self.assertIsInstance(stop, UserError)
    self.assertIn("from the middle of epoch 1 (step %d), whose data position "
                  "and LSTM state need the values it was trained with: "
                  "--train_from_zero_state is False there and True here; "
                  % (STOP_STEP + 1), str(stop))
    shutil.rmtree(self.save)
    self.finished_epoch_1()
    out, err, stop = ptb_word_lm_testing.run_in_process(args)
    self.assertIsNone(stop, err)
    self.assertIn(
        "Config changes at the end of epoch 1: train_from_zero_state=True (was "
        "False); the next epoch starts from the first window with a zero LSTM "
        "state, as every epoch does\n", out)
    with open(self.summary) as f:
      summary = json.load(f)
    self.assertIs(summary["train_from_zero_state"], True)
    self.assertEqual(summary["resumes"][-1]["config_changes"], {
        "max_max_epoch": {"from": 1, "to": 2},
        "train_from_zero_state": {"from": False, "to": True}})
    self.assertEqual([e["epoch"] for e in summary["epochs"]], [1, 2])
    # The checkpoints record it.
    self.assertIs(checkpoint.read_progress(tf.train.latest_checkpoint(
        self.save))[3]["train_from_zero_state"], True)

  def testUseBf16ChangesOnlyAtAnEpochsEnd(self):
    # Forced: the products' dtype is what is recorded, on any CPU.
    args = self.args(overridden()) + ["--use_bf16", "--force_bf16"]
    self.interrupted_in_epoch_1()
    _, _, stop = ptb_word_lm_testing.run_in_process(args)
    self.assertIsInstance(stop, UserError)
    self.assertIn("--use_bf16 is False there and True here", str(stop))
    shutil.rmtree(self.save)
    self.finished_epoch_1()
    out, err, stop = ptb_word_lm_testing.run_in_process(args)
    self.assertIsNone(stop, err)
    self.assertIn("Config changes at the end of epoch 1: use_bf16=True (was "
                  "False); the next epoch starts", out)
    with open(self.summary) as f:
      summary = json.load(f)
    self.assertEqual(summary["plan"]["products"], "bfloat16")
    self.assertEqual(summary["resumes"][-1]["config_changes"]["use_bf16"],
                     {"from": False, "to": True})
    self.assertIs(checkpoint.read_progress(tf.train.latest_checkpoint(
        self.save))[3]["use_bf16"], True)

  def testAKillAtEachWriteOfAnEpochsEndLosesNothing(self):
    kinds = ["summary", "checkpoint", "scalars"]
    for write in range(1, len(kinds) + 2):
      with self.subTest(write=write):
        shutil.rmtree(self.save, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
          os.remove(self.summary)
        with killed_at_epoch_end(1, write) as writes, \
            self.assertRaises(Killed):
          self.run_training()
        self.assertEqual(writes, kinds[:write])
        out = self.resumed()
        # What the resumed run prints is the uninterrupted run's end (epoch
        # 2 and the test at least), and the summary has every epoch's
        # perplexities and the test's as that run printed them.
        lines = perplexity_lines(out)
        self.assertGreaterEqual(len(lines), 3, out)
        self.assertEqual(lines, self.reference[-len(lines):])
        with open(self.summary) as f:
          summary = json.load(f)
        self.assertEqual([e["epoch"] for e in summary["epochs"]], [1, 2])
        self.assertEqual(
            [line.split(": ")[-1] for line in self.reference],
            ["%.3f" % e[k] for e in summary["epochs"]
             for k in ("train_perplexity", "valid_perplexity")] +
            ["%.3f" % summary["test_perplexity"]])
        self.assertEqual(summary["status"], "finished")

  def testACheckpointOfBlownUpWeightsIsSetAsideAndTheRerunFinishes(self):
    self.finished_epoch_1()
    sound = tf.train.latest_checkpoint(self.save)
    # One update at this rate takes the weights to about 1e27, still
    # finite; the step's checkpoint saves them before any cost shows it.
    out, err, stop = ptb_word_lm_testing.run_in_process(
        self.args(overridden("learning_rate=1e27")) +
        ["--save_every_steps=1"])
    self.assertIsInstance(stop, UserError, err)
    blown = os.path.join(self.save, "model.ckpt-%d" % (
        int(sound.rpartition("-")[2]) + 1))
    self.assertRegex(str(stop), r"^training diverged at epoch 2 step 2: the "
                     r"cost is \S+; %s, saved from weights that no cost had "
                     r"yet shown sound, is set aside as diverged-\*\.\.\.; "
                     r"the last good checkpoint, %s, is kept$"
                     % (re.escape(blown), re.escape(sound)))
    self.assertEqual(tf.train.latest_checkpoint(self.save), sound)
    self.assertTrue(os.path.exists(os.path.join(
        self.save, "diverged-" + os.path.basename(blown) + ".index")))
    # The same command at a sane rate goes on as if nothing had happened.
    out = self.resumed("max_max_epoch=2")
    self.assertIn("Resuming from epoch 2 step 0", out)
    self.assertEqual(perplexity_lines(out), self.reference[2:])

  def testCheckpointWithoutAConfigResumesWithAWarning(self):
    self.interrupted_in_epoch_1()
    ckpt = tf.train.latest_checkpoint(self.save)
    testing.drop_variables(ckpt, [checkpoint.CONFIG_VARIABLE])
    out, err, stop = self.run_training()
    self.assertIsNone(stop, err)
    # One line, named after the program.
    self.assertEqual(
        ptb_word_lm_testing.without_plan(err).partition(": warning: ")[2],
        "the checkpoint %s records no config "
        "(written by an older version): only its variables' shapes are "
        "checked against this run's; in the middle of epoch 1, its data "
        "position is taken to count windows of this run's num_steps=2\n"
        % ckpt)
    self.assertEqual(perplexity_lines(out), self.reference)
    self.assertIsNone(self.resumes_recorded()[-1]["config_changes"])
    # The new checkpoints record it.
    self.assertIsNotNone(checkpoint.read_progress(
        tf.train.latest_checkpoint(self.save))[3])

  def testCheckpointWithoutAConfigStillNeedsItsShapes(self):
    self.finished_epoch_1()
    testing.drop_variables(tf.train.latest_checkpoint(self.save),
                           [checkpoint.CONFIG_VARIABLE])
    _, err, stop = self.run_training("hidden_size=3")
    self.assertIn("records no config", err)
    self.assertIsInstance(stop, UserError)
    self.assertRegex(str(stop), r"holds a checkpoint of another "
                     r"configuration: Model/RNN/cell_0/bias is \[64\] there "
                     r"and \[12\] here")


class WhatMayChangeTest(tf.test.TestCase):
  """Resume.check and Resume.lines on records, without a checkpoint."""

  def resume(self, step, **new):
    cfg = ptb_word_lm_testing.learning_config()
    saved = resume_lib.record(cfg, 2, 1)
    for name, value in new.items():
      if name in ("towers", "workers"):
        continue
      setattr(cfg, name, value)
    run = resume_lib.record(cfg, new.get("towers", 2), new.get("workers", 1))
    return resume_lib.Resume("ckpt", (3, step, 1.0),
                             resume_lib.config_changes(saved, run), [])

  def testWeightFieldsNeverChange(self):
    for step in (0, 5):
      with self.assertRaisesRegex(
          UserError, r"^--save_path=S holds a checkpoint of another "
          r"configuration: hidden_size is 16 there and 32 here, vocab_size is "
          r"11 there and 12 here; these shape the weights: set them back, or "
          r"use another --save_path$"):
        self.resume(step, hidden_size=32, vocab_size=12).check("S")

  def testTowersAndWorkersChangeOnlyAtAnEpochsEnd(self):
    with self.assertRaisesRegex(
        UserError, r"towers \(--num_gpus, --cpu_towers\) is 2 there and 1 "
        r"here, workers \(--worker_hosts\) is 1 there and 2 here; resume "
        r"with those until epoch 4 ends"):
      self.resume(5, towers=1, workers=2).check("S")
    resume = self.resume(0, towers=1, workers=2, max_epoch=3)
    resume.check("S")
    self.assertEqual(resume.lines(), [
        "Config changes at the end of epoch 3: towers=1 (was 2), workers=2 "
        "(was 1); the next epoch starts from the first window with a zero "
        "LSTM state, as every epoch does",
        "Config changes since the checkpoint: max_epoch=3 (was 2)"])

  def testACheckpointThatPredatesTrainFromZeroStateCarriedItsState(self):
    cfg = ptb_word_lm_testing.learning_config()
    saved = resume_lib.record(cfg, 1, 1)
    del saved["train_from_zero_state"]
    self.assertEqual(resume_lib.config_changes(
        saved, resume_lib.record(cfg, 1, 1)), {})
    self.assertEqual(resume_lib.config_changes(
        saved, resume_lib.record(cfg, 1, 1, train_from_zero_state=True)),
                     {"train_from_zero_state": (False, True)})

  def testTheNormsSumMayChangeInAnEpochAndIsNamed(self):
    cfg = ptb_word_lm_testing.learning_config()
    saved = resume_lib.record(cfg, 1, 1)
    run = resume_lib.record(cfg, 1, 1, original_norm_threads=2)
    resume = resume_lib.Resume("ckpt", (3, 5, 1.0),
                               resume_lib.config_changes(saved, run), [])
    resume.check("S")  # in the middle of epoch 4: allowed
    self.assertEqual(resume.lines(), [
        "Config changes since the checkpoint: original_norm_threads=2 "
        "(was 0)"])
    self.assertEqual(resume.summary_changes(),
                     {"original_norm_threads": {"from": 0, "to": 2}})
    # A checkpoint written before the field was recorded summed exactly.
    del saved["original_norm_threads"]
    self.assertEqual(resume_lib.config_changes(
        saved, resume_lib.record(cfg, 1, 1)), {})

  def testNoChangeNoLine(self):
    resume = self.resume(5)
    resume.check("S")
    self.assertEqual((resume.lines(), resume.summary_changes()), ([], {}))


if __name__ == "__main__":
  tf.test.main()
