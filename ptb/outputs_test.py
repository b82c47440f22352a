"""Nothing lost, no surprises: outputs checked first, failed writes survived,
damaged checkpoints skipped, one run per save_path, flag ranges.

Real processes of ptb_word_lm.py, real files and real signals.
"""

import hashlib
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import tensorflow as tf

from ptb import config as config_lib
from ptb import testing
from ptb.errors import UserError



def checksums(directory):
  """{relative path: sha256} of every file under `directory`.

  Without `.lock`, which every run on a save_path takes and rewrites.
  """
  sums = {}
  for root, _, names in os.walk(directory):
    for name in names:
      if name == ".lock":
        continue
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        sums[os.path.relpath(path, directory)] = hashlib.sha256(
            f.read()).hexdigest()
  return sums


def final_test_perplexity(out):
  match = re.search(r"^Test Perplexity: (\S+)$", out, re.M)
  return float(match.group(1)) if match else None


def limit_file_size(max_bytes):
  """A preexec_fn: no file of the child may grow past `max_bytes`."""
  def apply():
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
  return apply


class OutputsTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._tmp = tempfile.TemporaryDirectory()
    cls.data = os.path.join(cls._tmp.name, "data")
    os.mkdir(cls.data)
    testing.make_structured_corpus(cls.data, train_lines=1500)
    cls.env = dict(os.environ, PTB_LSTM_KERNELS="0")

  @classmethod
  def tearDownClass(cls):
    cls._tmp.cleanup()
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.tmp = tmp.name

  def args(self, overrides="", *extra):
    return testing.learning_args(self.data, overrides) + list(extra)

  def run_script(self, *args, preexec_fn=None):
    proc = subprocess.run([sys.executable, testing.SCRIPT] + list(args),
                          capture_output=True, text=True, timeout=600,
                          cwd=testing.HERE, env=self.env,
                          preexec_fn=preexec_fn)
    return proc.returncode, proc.stdout, proc.stderr

  def assertRefused(self, args, pattern, code=1, untouched=None):
    """One error line, no traceback, `code`; `untouched` byte-identical."""
    before = checksums(untouched) if untouched else None
    testing.assert_user_error(self, args, pattern, code=code, env=self.env)
    if untouched:
      self.assertEqual(checksums(untouched), before)

  # 1. Every output is checked before any work starts.

  def testOutputsThatCannotBeWrittenAreRefusedFirst(self):
    blocker = os.path.join(self.tmp, "a_file")
    with open(blocker, "w") as f:
      f.write("x")
    a_dir = os.path.join(self.tmp, "a_dir")
    os.mkdir(a_dir)
    for flag, value, pattern in (
        ("memory_log", os.path.join(blocker, "sub", "m.csv"),
         r"--memory_log=.*a_file/sub/m\.csv cannot be written: Not a "
         r"directory \(.*a_file is a file\)"),
        ("summary_json", a_dir,
         r"--summary_json=.*a_dir is a directory; give a file name"),
        ("save_path", blocker,
         r"--save_path=.*a_file cannot be written: Not a directory "
         r"\(.*a_file is a file\)")):
      self.assertRefused(self.args("", "--%s=%s" % (flag, value)), pattern,
                         untouched=self.tmp)
    self.assertEqual(os.listdir(a_dir), [])

  def testMissingParentsOfOutputsAreCreated(self):
    log = os.path.join(self.tmp, "new", "sub", "m.csv")
    summary = os.path.join(self.tmp, "other", "s.json")
    code, out, err = self.run_script(*self.args(
        "max_max_epoch=1", "--memory_log=" + log, "--summary_json=" + summary))
    self.assertEqual(code, 0, err)
    self.assertTrue(os.path.getsize(log) > 0)
    self.assertTrue(os.path.getsize(summary) > 0)
    self.assertIn("Test Perplexity", out)

  # 2. Writes that fail during a run never cost the run.

  def testSummaryDirectoryRemovedMidRun(self):
    sub = os.path.join(self.tmp, "sub")
    summary = os.path.join(sub, "s.json")
    save = os.path.join(self.tmp, "save")
    # In epoch 2, after the summary of epoch 1 was written.
    proc, _ = testing.start_run(
        self.args("", "--summary_json=" + summary, "--save_path=" + save),
        self.env, progress_lines=12)
    self.assertTrue(os.path.exists(summary))
    shutil.rmtree(sub)
    out, err = proc.communicate(timeout=300)
    self.assertEqual(proc.returncode, 0, err)
    self.assertIn("Test Perplexity", out)
    self.assertIsNotNone(tf.train.latest_checkpoint(save))
    self.assertNotIn("Traceback", err)

  def testMemoryLogThatStopsGrowingStopsAloneWithAWarning(self):
    log = os.path.join(self.tmp, "m.csv")
    # Files may not grow past 1 KiB: the memory log, sampled every 10 ms,
    # reaches that early; the run writes nothing else.
    code, out, err = self.run_script(
        *self.args("max_max_epoch=1", "--memory_log=" + log,
                   "--memory_interval=0.01"),
        preexec_fn=limit_file_size(1024))
    self.assertEqual(code, 0, err)
    self.assertIn("Test Perplexity", out)
    warnings = [l for l in err.splitlines() if "warning:" in l]
    self.assertLen(warnings, 1, err)
    self.assertRegex(warnings[0], r"ptb_word_lm\.py: warning: the memory log "
                     r".*m\.csv can no longer be written \(.*\); it stops "
                     r"here, the training goes on")
    self.assertNotIn("Traceback", err)

  def testCheckpointThatCannotBeSavedStopsWithTheLastGoodOne(self):
    save = os.path.join(self.tmp, "save")
    code, _, err = self.run_script(*self.args("max_max_epoch=1",
                                              "--save_path=" + save))
    self.assertEqual(code, 0, err)
    good = tf.train.latest_checkpoint(save)
    before = checksums(save)
    # The disk is "full" for the next checkpoint: no file may grow past half
    # of a checkpoint's data file, the first file a save writes.
    limit = os.path.getsize(good + ".data-00000-of-00001") // 2
    code, out, err = self.run_script(
        *self.args("max_max_epoch=2", "--save_path=" + save),
        preexec_fn=limit_file_size(limit))
    self.assertEqual(code, 1, out + err)
    self.assertNotIn("Traceback", err)
    self.assertRegex(err, r"ptb_word_lm\.py: error: saving a checkpoint to "
                     r".*save failed \(.*\); the last good checkpoint is "
                     r"%s" % re.escape(good))
    # The good checkpoint is intact and still the one a run resumes from.
    after = checksums(save)
    for name in before:
      if not name.startswith("events."):
        self.assertEqual(after.get(name), before[name], name)
    self.assertEqual(tf.train.latest_checkpoint(save), good)
    code, out, err = self.run_script(*self.args("max_max_epoch=2",
                                                "--save_path=" + save))
    self.assertEqual(code, 0, err)
    self.assertIn("Resuming from epoch 2 step 0", out)

  # 3. Damaged checkpoints are survived.

  def _two_checkpoints(self, save):
    """Runs 2 epochs with a checkpoint after each; returns their paths."""
    code, out, err = self.run_script(*self.args("max_max_epoch=2",
                                                "--save_path=" + save))
    self.assertEqual(code, 0, err)
    state = tf.train.get_checkpoint_state(save)
    paths = list(state.all_model_checkpoint_paths)
    self.assertLen(paths, 2)
    return paths, final_test_perplexity(out)

  def testTruncatedCheckpointIsSkippedForThePreviousOne(self):
    save = os.path.join(self.tmp, "save")
    (older, newest), reference = self._two_checkpoints(save)
    data_file = newest + ".data-00000-of-00001"
    with open(data_file, "r+b") as f:
      f.truncate(os.path.getsize(data_file) // 2)
    before = checksums(save)
    code, out, err = self.run_script(*self.args("max_max_epoch=2",
                                                "--save_path=" + save))
    self.assertEqual(code, 0, err)
    self.assertNotIn("Traceback", err)
    self.assertRegex(err, r"ptb_word_lm\.py: warning: skipping the checkpoint "
                     r"%s, which cannot be read \(.*\)" % re.escape(newest))
    self.assertIn("Resuming from epoch 2 step 0 of %s" % save, out)
    self.assertAllClose(final_test_perplexity(out), reference, rtol=0.01)
    # Nothing of the earlier run was deleted or overwritten.
    after = checksums(save)
    for name, digest in before.items():
      if name != "checkpoint":
        self.assertEqual(after.get(name), digest, name)

  def testMissingAndDamagedFilesOfEveryCheckpoint(self):
    save = os.path.join(self.tmp, "save")
    (older, newest), _ = self._two_checkpoints(save)
    os.remove(older + ".index")
    with open(newest + ".index", "r+b") as f:
      f.seek(10)
      f.write(b"\xff" * 16)
    before = checksums(save)
    self.assertRefused(
        self.args("max_max_epoch=2", "--save_path=" + save),
        r"no checkpoint in .*save can be read .*; move the damaged files out "
        r"of it to start afresh there, or use another --save_path",
        untouched=save)
    self.assertEqual(checksums(save), before)

  # 4. One run per save_path.

  def testSecondRunOnTheSameSavePathRefusesAtOnce(self):
    save = os.path.join(self.tmp, "save")
    # Longer than the test: it is stopped by a signal once checked.
    first, lines = testing.start_run(
        self.args("max_max_epoch=1000", "--save_path=" + save), self.env)
    start = time.time()
    before = set(os.listdir(save))
    _, err = testing.assert_user_error(
        self, self.args("max_max_epoch=1000", "--save_path=" + save),
        r"--save_path=.*save is in use by another run \(process %d\); wait "
        r"for it to end, or use another --save_path" % first.pid,
        env=self.env)
    self.assertLess(time.time() - start, 60)
    self.assertIsNone(first.poll())   # the first run goes on, undisturbed
    # Whatever is new in the directory is the first run's: its epochs'
    # checkpoints, TensorBoard events and checkpoint index, the latter with
    # the temporary file TensorFlow writes it through when caught mid-save
    # (the second run wrote nothing).
    new = set(os.listdir(save)) - before
    self.assertTrue(all(n.startswith(("model.ckpt-", "events.",
                                      "checkpoint.tmp")) or
                        n == "checkpoint" for n in new), new)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=120)
    out = "".join(lines) + out
    self.assertEqual(first.returncode, 130, err)
    self.assertRegex(err, r"interrupted by SIGINT .*checkpoint saved to")
    self.assertNotIn("Resuming", out)
    # A crashed holder blocks nobody: the kernel dropped its lock.
    victim, _ = testing.start_run(
        self.args("max_max_epoch=1000", "--save_path=" + save), self.env)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    code, out, err = self.run_script(*self.args("max_max_epoch=1",
                                                "--save_path=" + save))
    self.assertEqual(code, 0, err)   # resumed past the last epoch: tests
    self.assertIn("Test Perplexity", out)

  # 5. Every numeric flag's range.

  def testFlagRanges(self):
    bad = {"eval_unroll": 0, "memory_interval": 0.0, "save_every_steps": -1,
           "cluster_timeout": 0.0, "intra_op_threads": -1,
           "inter_op_threads": -1, "task_index": -1, "seed": -1,
           "num_gpus": -1, "cpu_towers": 0}
    self.assertCountEqual(bad, config_lib.FLAG_RANGES)
    for flag, value in bad.items():
      with self.assertRaisesRegex(UserError, r"--%s=\S+ must be" % flag) as e:
        config_lib.check_flag_ranges({flag: value})
      self.assertEqual(e.exception.exit_code, 2)
    # Through the script (main passes every flag of FLAG_RANGES), an int
    # flag and a float one.
    for flag, value in (("seed", "-1"), ("memory_interval", "0")):
      self.assertRefused(self.args("", "--%s=%s" % (flag, value)),
                         r"--%s=\S+ must be" % flag, code=2)

  # The message of an interrupted run without --save_path says the truth.

  def testInterruptWithoutSavePathSaysNothingCanBeResumed(self):
    proc, _ = testing.start_run(self.args("max_max_epoch=6"), self.env)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    self.assertEqual(proc.returncode, 130, err)
    self.assertRegex(err, r"interrupted by SIGINT in the train pass of epoch "
                     r"1 at step \d+ \(nothing saved: without --save_path a "
                     r"run cannot be resumed; add --save_path=DIR to make "
                     r"the next run resumable\)")
    self.assertNotIn("run the same command to resume", err)


if __name__ == "__main__":
  tf.test.main()
