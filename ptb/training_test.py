"""Resume, interrupts, divergence and bad input, through the real command line.

The interrupt tests send real signals to a real subprocess.
"""

import csv
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

import tensorflow as tf

from ptb import testing
from ptb.errors import UserError
from ptb_word_lm_testing import run_in_process



def final_test_perplexity(out):
  match = re.search(r"^Test Perplexity: (\S+)$", out, re.M)
  return float(match.group(1)) if match else None


def perplexity_lines(out):
  """The run's Train, Valid and Test perplexity lines, as printed."""
  return re.findall(r"^(?:Epoch: \d+ (?:Train|Valid) |Test )Perplexity: .*$",
                    out, re.M)


def snapshot(directory):
  """Names, sizes and modification times of the files in `directory`.

  Without `.lock`, which every run on the directory takes and rewrites.
  """
  return {name: (os.path.getsize(os.path.join(directory, name)),
                 os.path.getmtime(os.path.join(directory, name)))
          for name in sorted(os.listdir(directory)) if name != ".lock"}


class RobustnessTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._tmp = tempfile.TemporaryDirectory()
    # A corpus that needs the LSTM state carried from step to step (a run
    # that loses it, or its data position, on resume ends far above
    # LEARNED_TEST_PERPLEXITY), long enough that a first epoch lasts a few
    # hundred steps.
    cls.data = os.path.join(cls._tmp.name, "data")
    os.mkdir(cls.data)
    testing.make_structured_corpus(cls.data, train_lines=3000)
    cls.base = cls.args()
    code, out, err = testing.run_script(*cls.base)
    assert code == 0, err
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

  @classmethod
  def tearDownClass(cls):
    cls._tmp.cleanup()
    super().tearDownClass()

  def _interrupt(self, save, sig, extra=(), progress_lines=2):
    """Starts a run, sends `sig` after its `progress_lines`-th progress line."""
    proc = subprocess.Popen(
        [sys.executable, testing.SCRIPT] + self.base +
        ["--save_path=" + save] + list(extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=testing.HERE, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen = 0
    for line in proc.stdout:
      if "wps" in line:
        seen += 1
        if seen == progress_lines:
          break
    self.assertEqual(seen, progress_lines, "the run ended before the signal")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err

  def assertResumedExactly(self, out):
    """The resumed run printed the uninterrupted run's perplexities."""
    # Every perplexity is printed: epoch 1's train perplexity too, from the
    # summed cost that the checkpoint carries.
    self.assertEqual(perplexity_lines(out), self.reference)

  def _check_resumes(self, sig, code):
    with tempfile.TemporaryDirectory() as save:
      exit_code, _, err = self._interrupt(save, sig)
      self.assertEqual(exit_code, code, err)
      self.assertNotIn("Traceback", err)
      self.assertRegex(err, r"interrupted by %s in the train pass of epoch 1 "
                       r"at step \d+ \(checkpoint saved to .*model\.ckpt-\d+\)"
                       % signal.Signals(sig).name)
      exit_code, out, err = testing.run_script(*(self.base +
                                                 ["--save_path=" + save]))
      self.assertEqual(exit_code, 0, err)
      match = re.search(r"^Resuming from epoch 1 step (\d+) of %s$"
                        % re.escape(save), out, re.M)
      self.assertIsNotNone(match, out)
      self.assertGreater(int(match.group(1)), 0)
      self.assertResumedExactly(out)

  def testSigtermSavesAndResumes(self):
    self._check_resumes(signal.SIGTERM, 143)

  def testSigintSavesAndResumes(self):
    self._check_resumes(signal.SIGINT, 130)

  def testSigkillKeepsTheLastCheckpointUsable(self):
    with tempfile.TemporaryDirectory() as save:
      outputs = ["--summary_json=" + os.path.join(save, "summary.json"),
                 "--memory_log=" + os.path.join(save, "memory.csv")]
      # Progress lines come at steps 10, 77 and 144 (675 steps an epoch):
      # by the third, the checkpoint of step 100 has been written.
      self._interrupt(save, signal.SIGKILL,
                      ["--save_every_steps=100"] + outputs, progress_lines=3)
      self.assertIsNotNone(tf.train.latest_checkpoint(save))
      code, out, err = testing.run_script(*(self.base + outputs +
                                            ["--save_path=" + save]))
      self.assertEqual(code, 0, err)
      match = re.search(r"^Resuming from epoch 1 step (\d+) of ", out, re.M)
      self.assertIsNotNone(match, out)
      step = int(match.group(1))
      self.assertGreater(step, 0)
      self.assertEqual(step % 100, 0)
      self.assertResumedExactly(out)
      self.assertSummaryAndLogHoldBothProcesses(save, step)

  def assertSummaryAndLogHoldBothProcesses(self, save, step):
    """The same command's summary and memory log describe the whole run."""
    with open(os.path.join(save, "summary.json")) as f:
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
    with open(os.path.join(save, "memory.csv"), newline="") as f:
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
    with tempfile.TemporaryDirectory() as save:
      args = self.base + ["--save_path=" + save]
      code, first, err = testing.run_script(*args)
      self.assertEqual(code, 0, err)
      # With no epoch left (docs/running.md: testing an unfinished run's
      # weights), it only tests, and the saved weights give the same figure.
      code, out, err = testing.run_script(*args)
      self.assertEqual(code, 0, err)
      self.assertIn("Resuming from epoch 4 step 0 of %s" % save, out)
      self.assertNotIn("Epoch:", out)
      self.assertEqual(final_test_perplexity(out),
                       final_test_perplexity(first))
      code, out, err = testing.run_script(
          *(self.args("max_max_epoch=4") + ["--save_path=" + save]))
      self.assertEqual(code, 0, err)
      self.assertIn("Resuming from epoch 4 step 0 of %s" % save, out)
      # max_epoch is 2 and lr_decay 0.5: epoch 4 trains at 0.25.
      self.assertIn("Epoch: 4 Learning rate: 0.250", out)
      self.assertNotRegex(out, "Epoch: [123] ")

  def testCheckpointWithOrWithoutTheDropoutSeedResumes(self):
    # A checkpoint written before the masks' key and count were saved.
    with tempfile.TemporaryDirectory() as save:
      code, _, err = testing.run_script(
          *(self.args("max_max_epoch=1") + ["--save_path=" + save]))
      self.assertEqual(code, 0, err)
      ckpt = tf.train.latest_checkpoint(save)
      testing.drop_variables(ckpt, ["dropout/key", "dropout/draws"])
      code, out, err = testing.run_script(
          *(self.args("max_max_epoch=2") + ["--save_path=" + save]))
      self.assertEqual(code, 0, err)
      self.assertIn("Resuming from epoch 2 step 0 of %s" % save, out)
      self.assertIn("%s has no dropout/draws, dropout/key (written without "
                    "dropout, or by an older version): they start afresh"
                    % ckpt, err)
      self.assertRegex(out, r"Epoch: 2 Valid Perplexity: \d")
      # The other way round: a checkpoint with them, resumed without dropout.
      code, out, err = testing.run_script(
          *(self.args("max_max_epoch=3,keep_prob=1") + ["--save_path=" + save]))
      self.assertEqual(code, 0, err)
      self.assertIn("Resuming from epoch 3 step 0 of %s" % save, out)
      self.assertNotIn("dropout/", err)

  def testCheckpointOfAnotherConfigurationIsRefused(self):
    with tempfile.TemporaryDirectory() as save:
      outputs = ["--save_path=" + save,
                 "--summary_json=" + os.path.join(save, "summary.json"),
                 "--memory_log=" + os.path.join(save, "memory.csv")]
      code, _, err = testing.run_script(*(self.base + outputs))
      self.assertEqual(code, 0, err)
      before = snapshot(save)
      code, _, err = testing.run_script(
          *(self.args("hidden_size=3") + outputs))
      self.assertEqual(code, 1)
      self.assertNotIn("Traceback", err)
      self.assertIn("error: --save_path=%s holds a checkpoint of another "
                    "configuration: hidden_size is 16 there and 3 here; these "
                    "shape the weights: set them back, or use another "
                    "--save_path\n" % save, err)
      # Nor are the summary and the memory log touched.
      self.assertEqual(snapshot(save), before)

  def testDivergenceStopsAndKeepsTheLastGoodCheckpoint(self):
    with tempfile.TemporaryDirectory() as save:
      code, _, err = testing.run_script(*(self.base + ["--save_path=" + save]))
      self.assertEqual(code, 0, err)
      before = snapshot(save)
      code, out, err = testing.run_script(
          *(self.args("max_max_epoch=4,learning_rate=1e38") +
            ["--save_path=" + save]))
      self.assertEqual(code, 1, out)
      self.assertNotIn("Traceback", err)
      self.assertRegex(err, r"error: training diverged (at epoch 4 step \d+: "
                       r"the cost is (nan|inf)|in epoch 4: the weights are not "
                       r"finite); the last good checkpoint in %s is kept"
                       % re.escape(save))
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
      _, err, stop = run_in_process([
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
