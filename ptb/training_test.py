"""Interrupts, resume, divergence and bad input.

The interrupt tests send real signals to a real process of ptb_word_lm.py;
every other run, and every resume, is main's in this test's process
(ptb_word_lm_testing.run_in_process), on the same command line.
"""

import csv
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import tensorflow as tf

from ptb import checkpoint
from ptb import testing
from ptb.errors import UserError
import ptb_word_lm_testing


def final_test_perplexity(out):
  match = re.search(r"^Test Perplexity: (\S+)$", out, re.M)
  return float(match.group(1)) if match else None


def valid_perplexity(out, epoch):
  match = re.search(r"^Epoch: %d Valid Perplexity: (\S+)$" % epoch, out, re.M)
  return float(match.group(1)) if match else None


def perplexity_lines(out):
  """The run's Train, Valid and Test perplexity lines, as printed."""
  return re.findall(r"^(?:Epoch: \d+ (?:Train|Valid) |Test )Perplexity: .*$",
                    out, re.M)


def warnings(err):
  """The warning lines of a run's stderr."""
  return [line for line in err.splitlines() if ": warning: " in line]


def snapshot(directory):
  """Names, sizes and modification times of the files in `directory`.

  Without `.lock`, which every run on the directory takes and rewrites.
  """
  return {name: (os.path.getsize(os.path.join(directory, name)),
                 os.path.getmtime(os.path.join(directory, name)))
          for name in sorted(os.listdir(directory)) if name != ".lock"}


class RobustnessTest(ptb_word_lm_testing.SavePathTest):
  """Signals, resumes, refused checkpoints and divergence.

  One reference run, in this process, trains the 3 epochs uninterrupted
  and saves them in `finished` (with its summary and memory log): the
  interrupted runs must resume to its perplexities, and the tests that
  continue a finished run start from a copy of its directory.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._tmp = tempfile.TemporaryDirectory()
    # A corpus that needs the LSTM state carried from step to step (a run
    # that loses it, or its data position, on resume ends far above
    # LEARNED_TEST_PERPLEXITY), long enough that a first epoch lasts a few
    # hundred steps: a real process is still in it when the signal that
    # follows its second progress line arrives.
    cls.data = os.path.join(cls._tmp.name, "data")
    os.mkdir(cls.data)
    testing.make_structured_corpus(cls.data, train_lines=3000)
    cls.base = cls.args()
    cls.finished = os.path.join(cls._tmp.name, "finished")
    out, err, stop = ptb_word_lm_testing.run_in_process(
        cls.base + cls.outputs(cls.finished))
    assert stop is None, err
    cls.reference = perplexity_lines(out)
    assert final_test_perplexity(out) < testing.LEARNED_TEST_PERPLEXITY, out

  @classmethod
  def args(cls, overrides=""):
    """The command line of the runs, with `overrides` after the learning ones.

    With dropout, as medium and large train: a resumed run must draw the
    masks the uninterrupted one drew.
    """
    return testing.learning_args(
        cls.data, ",".join(filter(None, ["keep_prob=0.5", overrides])))

  @staticmethod
  def outputs(save):
    """--save_path=`save`, with the summary and the memory log inside it."""
    return ["--save_path=" + save,
            "--summary_json=" + os.path.join(save, "summary.json"),
            "--memory_log=" + os.path.join(save, "memory.csv")]

  @classmethod
  def tearDownClass(cls):
    cls._tmp.cleanup()
    super().tearDownClass()

  def copy_of_finished(self):
    """The test's save_path, a copy of the reference run's; returns it."""
    shutil.copytree(self.finished, self.save)
    return self.save

  def run_main(self, args, run_epoch=None):
    """main with the command line `args`, in this process; see run_in_process.

    Returns:
      (stdout, stderr, the Stop that ended the run or None).
    """
    return ptb_word_lm_testing.run_in_process(args, run_epoch)

  def _interrupt(self, sig, extra=(), progress_lines=2):
    """A real run on the test's save_path, sent `sig` after a progress line.

    The signal follows its `progress_lines`-th progress line.

    Returns:
      (exit code, stderr).
    """
    proc = subprocess.Popen(
        [sys.executable, testing.SCRIPT] + self.base +
        ["--save_path=" + self.save] + list(extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=testing.HERE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    self.addCleanup(proc.kill)
    seen = 0
    for line in proc.stdout:
      if "wps" in line:
        seen += 1
        if seen == progress_lines:
          break
    self.assertEqual(seen, progress_lines, "the run ended before the signal")
    proc.send_signal(sig)
    # A run that ignores the signal ends with its last epoch.
    _, err = proc.communicate()
    return proc.returncode, err

  def assertInterruptSaved(self, sig, code):
    """A real `sig` saves and stops the run; returns the step of its save.

    The step is the training calls done: the checkpoint's, the one a resume
    continues from.
    """
    exit_code, err = self._interrupt(sig)
    self.assertEqual(exit_code, code, err)
    self.assertNotIn("Traceback", err)
    match = re.search(r"interrupted by %s in the train pass of epoch 1 at "
                      r"step (\d+) \(checkpoint saved to (.*model\.ckpt-\d+)\)"
                      % signal.Signals(sig).name, err)
    self.assertIsNotNone(match, err)
    step = int(match.group(1)) + 1
    self.assertEqual(match.group(2), tf.train.latest_checkpoint(self.save))
    self.assertEqual(checkpoint.read_progress(match.group(2))[:2], (0, step))
    return step

  def assertResumedExactly(self, out):
    """The resumed run printed the uninterrupted run's perplexities."""
    # Every perplexity is printed: epoch 1's train perplexity too, from the
    # summed cost that the checkpoint carries.
    self.assertEqual(perplexity_lines(out), self.reference)

  def testSigtermSavesAndResumes(self):
    step = self.assertInterruptSaved(signal.SIGTERM, 143)
    out, err, stop = self.run_main(self.base + ["--save_path=" + self.save])
    self.assertIsNone(stop, err)
    self.assertIn("Resuming from epoch 1 step %d of %s\n" % (step, self.save),
                  out)
    self.assertResumedExactly(out)

  def testSigintSavesAndStops(self):
    # SIGINT takes SIGTERM's way (watch.SignalCatcher), whose checkpoint
    # testSigtermSavesAndResumes resumes: here, the exit code, the message
    # and the progress that the checkpoint holds.
    self.assertInterruptSaved(signal.SIGINT, 130)

  def testSigkillKeepsTheLastCheckpointUsable(self):
    outputs = self.outputs(self.save)[1:]
    # Progress lines come at steps 10, 77 and 144 (675 steps an epoch):
    # by the third, the checkpoint of step 100 has been written.
    code, _ = self._interrupt(signal.SIGKILL,
                              ["--save_every_steps=100"] + outputs,
                              progress_lines=3)
    self.assertEqual(code, -signal.SIGKILL)
    self.assertIsNotNone(tf.train.latest_checkpoint(self.save))
    out, err, stop = self.run_main(self.base + outputs +
                              ["--save_path=" + self.save])
    self.assertIsNone(stop, err)
    match = re.search(r"^Resuming from epoch 1 step (\d+) of ", out, re.M)
    self.assertIsNotNone(match, out)
    step = int(match.group(1))
    self.assertGreater(step, 0)
    self.assertEqual(step % 100, 0)
    self.assertResumedExactly(out)
    self.assertSummaryAndLogHoldBothProcesses(step)

  def assertSummaryAndLogHoldBothProcesses(self, step):
    """The same command's summary and memory log describe the whole run."""
    with open(os.path.join(self.save, "summary.json")) as f:
      summary = json.load(f)
    self.assertEqual(summary["status"], "finished")
    self.assertEqual(
        ["Epoch: %d Valid Perplexity: %.3f" % (e["epoch"],
                                               e["valid_perplexity"])
         for e in summary["epochs"]],
        [line for line in self.reference if "Valid" in line])
    (resume,) = summary["resumes"]
    self.assertEqual((resume["epoch"], resume["step"]), (1, step))
    # The killed process's time, up to its save of that step, is counted.
    self.assertGreater(resume["wall_seconds"], 0)
    self.assertGreater(summary["wall_seconds"], resume["wall_seconds"])
    with open(os.path.join(self.save, "memory.csv"), newline="") as f:
      rows = list(csv.reader(f))
    self.assertEqual(rows[0], ["seconds", "rss_mib", "phase", "epoch", "step"])
    seconds = [float(r[0]) for r in rows[1:]]
    self.assertEqual(seconds, sorted(seconds))
    phases = [key for key, _ in itertools.groupby(
        (r[2], int(r[3])) for r in rows[1:])]
    self.assertEqual(phases, [("startup", 0), ("train", 1), ("startup", 0),
                              ("train", 1), ("valid", 1), ("train", 2),
                              ("valid", 2), ("train", 3), ("valid", 3),
                              ("test", 3)])

  def testResumeAfterAFinishedEpochKeepsTheSchedule(self):
    args = self.base + ["--save_path=" + self.copy_of_finished()]
    # With no epoch left (docs/running.md: testing an unfinished run's
    # weights), it only tests, and the saved weights give the same figure.
    out, err, stop = self.run_main(args)
    self.assertIsNone(stop, err)
    self.assertIn("Resuming from epoch 4 step 0 of %s\n" % self.save, out)
    self.assertNotIn("Epoch:", out)
    self.assertEqual(perplexity_lines(out), self.reference[-1:])
    # Stopped after epoch 4's first step: its learning rate is what counts.
    out, err, stop = self.run_main(
        self.args("max_max_epoch=4") + ["--save_path=" + self.save],
        ptb_word_lm_testing.interrupting(0))
    self.assertEqual(stop.exit_code, 143, err)
    self.assertIn("Resuming from epoch 4 step 0 of %s\n" % self.save, out)
    # max_epoch is 2 and lr_decay 0.5: epoch 4 trains at 0.25.
    self.assertIn("Epoch: 4 Learning rate: 0.250\n", out)
    self.assertNotRegex(out, "Epoch: [123] ")
    self.assertRegex(str(stop), "^interrupted by SIGTERM in the train pass "
                     "of epoch 4 at step 0 ")

  def testCheckpointWithOrWithoutTheDropoutSeedResumes(self):
    # A checkpoint written before the masks' key and count were saved.
    ckpt = tf.train.latest_checkpoint(self.copy_of_finished())
    testing.drop_variables(ckpt, ["dropout/key", "dropout/draws"])
    out, err, stop = self.run_main(self.args("max_max_epoch=4") +
                              ["--save_path=" + self.save])
    self.assertIsNone(stop, err)
    self.assertIn("Resuming from epoch 4 step 0 of %s\n" % self.save, out)
    (warning,) = warnings(err)
    self.assertIn("%s has no dropout/draws, dropout/key (written without "
                  "dropout, or by an older version): they start afresh"
                  % ckpt, warning)
    # Epoch 4 went on from the trained weights (a fresh model's first epoch
    # ends above 5).
    self.assertLess(valid_perplexity(out, 4), testing.LEARNED_TEST_PERPLEXITY)
    # The other way round: a checkpoint with them, resumed without dropout
    # (with no epoch left, it only restores and tests).
    self.assertCountEqual(
        [name for name in tf.train.load_checkpoint(tf.train.latest_checkpoint(
            self.save)).get_variable_to_shape_map() if "dropout/" in name],
        ["dropout/key", "dropout/draws"])
    out, err, stop = self.run_main(self.args("max_max_epoch=4,keep_prob=1") +
                              ["--save_path=" + self.save])
    self.assertIsNone(stop, err)
    self.assertIn("Resuming from epoch 5 step 0 of %s\n" % self.save, out)
    self.assertLess(final_test_perplexity(out),
                    testing.LEARNED_TEST_PERPLEXITY)
    self.assertEqual(warnings(err), [])

  def testCheckpointOfAnotherConfigurationIsRefused(self):
    save = self.copy_of_finished()
    before = snapshot(save)
    _, _, stop = self.run_main(self.args("hidden_size=3") + self.outputs(save))
    self.assertIsInstance(stop, UserError)
    self.assertEqual(stop.exit_code, 1)
    self.assertEqual(str(stop), "--save_path=%s holds a checkpoint of another "
                     "configuration: hidden_size is 16 there and 3 here; these "
                     "shape the weights: set them back, or use another "
                     "--save_path" % save)
    # Nor are the summary and the memory log touched.
    self.assertEqual(snapshot(save), before)

  def testDivergenceStopsAndKeepsTheLastGoodCheckpoint(self):
    save = self.copy_of_finished()
    before = snapshot(save)
    out, _, stop = self.run_main(
        self.args("max_max_epoch=4,learning_rate=1e38") +
        ["--save_path=" + save])
    self.assertIsInstance(stop, UserError, out)
    self.assertEqual(stop.exit_code, 1)
    self.assertRegex(str(stop), r"^training diverged (at epoch 4 step \d+: "
                     r"the cost is \S+|in epoch 4: the weights are not "
                     r"finite); the last good checkpoint, %s, is kept$"
                     % re.escape(tf.train.latest_checkpoint(save)))
    after = snapshot(save)
    for name, stat in before.items():  # A new events file may be added.
      self.assertEqual(after.get(name), stat, name)


class BadInputTest(tf.test.TestCase):
  """A run refused for its config or its corpus writes nothing.

  main checks the outputs, the config and the corpus before it creates any
  of its outputs; these runs, in this process, are refused after the
  outputs' checks. Each error's message is checked once where it is raised
  (ptb_word_lm_test's ErrorTest, reader_test, ptb/outputs_test).
  """

  def assertRefusedWritingNothing(self, data, overrides, pattern, code=1):
    with tempfile.TemporaryDirectory() as tmp:
      _, err, stop = ptb_word_lm_testing.run_in_process([
          "--data_path=" + data, "--num_gpus=0", "--model=test",
          "--config_overrides=" + overrides,
          "--save_path=" + os.path.join(tmp, "save"),
          "--summary_json=" + os.path.join(tmp, "summary.json"),
          "--memory_log=" + os.path.join(tmp, "memory.csv")])
      self.assertIsInstance(stop, UserError, err)
      self.assertRegex(str(stop), pattern)
      self.assertEqual(stop.exit_code, code)
      self.assertEqual(os.listdir(tmp), [])

  def testBadConfigValue(self):
    with tempfile.TemporaryDirectory() as tmp:
      self.assertRefusedWritingNothing(
          testing.make_corpus(tmp), "num_steps=0",
          "num_steps=0 must be a positive integer", code=2)

  def testCorpusTooShort(self):
    with tempfile.TemporaryDirectory() as tmp:
      self.assertRefusedWritingNothing(
          testing.make_corpus(tmp, train_lines=2), "",
          "epoch_size == 0, decrease batch_size or num_steps: ptb.train.txt")

  def testVocabularyTooLarge(self):
    with tempfile.TemporaryDirectory() as tmp:
      self.assertRefusedWritingNothing(
          testing.make_corpus(tmp, num_words=30), "vocab_size=10",
          "31 distinct words.*vocab_size is 10")

  def testFileThatIsADirectory(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      os.remove(os.path.join(tmp, "ptb.valid.txt"))
      os.mkdir(os.path.join(tmp, "ptb.valid.txt"))
      self.assertRefusedWritingNothing(
          tmp, "", "ptb.valid.txt is a directory, not a text file")


if __name__ == "__main__":
  tf.test.main()
