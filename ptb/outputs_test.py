"""Nothing lost, no surprises: outputs checked first, failed writes survived,
damaged checkpoints skipped, one run per save_path, flag ranges.

Real processes of ptb_word_lm.py, real files and real signals.
"""

import errno
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from unittest import mock

import tensorflow as tf

from ptb import checkpoint
from ptb import config as config_lib
from ptb import errors
from ptb import outputs
from ptb import tensorboard
from ptb import testing
from ptb.errors import UserError
import ptb_word_lm_testing



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
                     r".*m\.csv can no longer be written \(File too large\); "
                     r"it keeps the rows written before and stops there, the "
                     r"training goes on")
    self.assertNotIn("Traceback", err)

  def testCheckpointsThatCannotBeSavedCostNothingElse(self):
    save = os.path.join(self.tmp, "save")
    code, _, err = self.run_script(*self.args("max_max_epoch=1",
                                              "--save_path=" + save))
    self.assertEqual(code, 0, err)
    good = tf.train.latest_checkpoint(save)
    before = checksums(save)
    # The disk is "full" for the next checkpoints: no file may grow past half
    # of a checkpoint's data file, the first file a save writes.
    limit = os.path.getsize(good + ".data-00000-of-00001") // 2
    code, out, err = self.run_script(
        *self.args("max_max_epoch=3", "--save_path=" + save),
        preexec_fn=limit_file_size(limit))
    # The run trains and tests to the end, and its status says it is not
    # saved.
    self.assertEqual(code, 1, out + err)
    self.assertIn("Epoch: 3 Valid Perplexity", out)
    self.assertIn("Test Perplexity", out)
    self.assertNotIn("Traceback", err)
    failed = (r"saving a checkpoint to .*save failed \(File too large\); the "
              r"last good checkpoint is %s" % re.escape(good))
    warnings = [l for l in err.splitlines() if "warning:" in l]
    self.assertLen(warnings, 2, err)   # after epochs 2 and 3
    for line in warnings:
      self.assertRegex(line, r"^ptb_word_lm\.py: warning: %s; the training "
                       r"goes on, and the next save tries again$" % failed)
    self.assertRegex(err, r"\nptb_word_lm\.py: error: the run is finished, "
                     r"but its end is not saved: %s\n$" % failed)
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


def no_space_error(prefix):
  """The error Saver.save raises on a full disk, as TensorFlow words it."""
  return tf.errors.ResourceExhaustedError(None, None, (
      "Graph execution error:\n\nDetected at node 'save/SaveV2' defined at "
      "(most recent call last):\n    File \"ptb_word_lm.py\", line 1, in "
      "<module>\nNode: 'save/SaveV2'\n%s.data-00000-of-00001.tempstate1; No "
      "space left on device\n\t [[{{node save/SaveV2}}]]" % prefix))


class FailedWriteTest(ptb_word_lm_testing.InProcessRunTest):
  """Writes that fail with ENOSPC, in this process: the reason, and the run.

  Saver.save is replaced by one that raises what TensorFlow raises on a
  full disk (its message's first line is "Graph execution error:").
  """

  def run_with_full_disk(self, failing_saves, run_epoch=None):
    """A run of 2 epochs whose first `failing_saves` saves fail with ENOSPC.

    Returns:
      (stdout, stderr's lines, the Stop that ended the run or None).
    """
    real_save = tf.compat.v1.train.Saver.save
    calls = []

    def save(saver, session, prefix, **kwargs):
      calls.append(prefix)
      if len(calls) <= failing_saves:
        # What a save cut short by a full disk leaves.
        for left in (prefix + ".data-00000-of-00001.tempstate1",
                     os.path.join(self.save, "checkpoint.tmp2")):
          open(left, "w").close()
        raise no_space_error(prefix)
      return real_save(saver, session, prefix, **kwargs)

    with mock.patch.object(tf.compat.v1.train.Saver, "save", autospec=True,
                           side_effect=save):
      out, err, stop = ptb_word_lm_testing.run_in_process(
          self.args("max_max_epoch=2"), run_epoch)
    return out, err.splitlines(), stop

  def testAFullDiskCostsTheCheckpointsOnly(self):
    out, warnings, stop = self.run_with_full_disk(failing_saves=3)
    failed = ("saving a checkpoint to %s failed (No space left on device); "
              "the last good checkpoint is none: nothing was saved"
              % self.save)
    self.assertEqual([w.partition(": warning: ")[2] for w in warnings],
                     ["%s; the training goes on, and the next save tries "
                      "again" % failed] * 2)   # after epochs 1 and 2
    self.assertIn("Epoch: 2 Valid Perplexity", out)
    self.assertIn("Test Perplexity", out)
    self.assertIsInstance(stop, UserError)
    self.assertEqual(stop.exit_code, 1)
    self.assertEqual(str(stop), "the run is finished, but its end is not "
                     "saved: " + failed)
    with open(self.summary) as f:
      summary = json.load(f)
    self.assertEqual(summary["status"], "finished")
    self.assertIsNotNone(summary["test_perplexity"])
    # The failed saves' temporary files, which fill a full disk, are gone.
    self.assertEqual([n for n in os.listdir(self.save) if ".tempstate" in n
                      or n.startswith("checkpoint.tmp")], [])

  def testTheNextSaveTriesAgain(self):
    out, warnings, stop = self.run_with_full_disk(failing_saves=1)
    self.assertIsNone(stop)
    self.assertLen(warnings, 1)
    self.assertIn("(No space left on device); the last good checkpoint is "
                  "none: nothing was saved; the training goes on",
                  warnings[0])
    self.assertIn("Saving model to %s." % self.save, out)
    self.assertEqual(checkpoint.read_progress(
        tf.train.latest_checkpoint(self.save))[:2], (2, 0))

  def testAnInterruptWhoseSaveFailsSaysWhatIsLeft(self):
    _, warnings, stop = self.run_with_full_disk(
        failing_saves=1, run_epoch=ptb_word_lm_testing.interrupting(30))
    self.assertEqual(warnings, [])
    self.assertEqual(stop.exit_code, 143)
    self.assertEqual(
        str(stop), "interrupted by SIGTERM in the train pass of epoch 1 at "
        "step 30 (saving a checkpoint to %s failed (No space left on device); "
        "the last good checkpoint is none: nothing was saved)" % self.save)

  def testTheReasonOfAnErrorThatDoesNotGiveIt(self):
    # Without the errno text in the message, a probe write finds it.
    bare = tf.errors.UnknownError(None, None, "Graph execution error:\n\n")
    with mock.patch.object(errors.tempfile, "TemporaryFile", side_effect=(
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))):
      self.assertEqual(errors.write_failure(bare, self.save),
                       "No space left on device")
    self.assertEqual(errors.write_failure(no_space_error("x")),
                     "No space left on device")

  def testAFullDiskAtTheStartIsAUserError(self):
    with mock.patch.object(outputs.os, "write", side_effect=OSError(
        errno.ENOSPC, os.strerror(errno.ENOSPC))):
      with self.assertRaisesRegex(UserError, r"^--save_path=%s cannot be "
                                  r"written: No space left on device$"
                                  % re.escape(self.save)):
        outputs.SavePathLock(self.save).acquire()

  def testTensorBoardScalarsStopWithTheReason(self):
    os.mkdir(self.save)
    writer = tensorboard.ScalarWriter(self.save)
    writer.add(1, {"Learning Rate": 1.0})
    writer.close()
    # Every write to /dev/full fails with ENOSPC, as on a full disk.
    full = tf.io.TFRecordWriter("/dev/full")
    writer._writer = full  # pylint: disable=protected-access
    with mock.patch.object(tensorboard, "warn") as warn:
      writer.add(2, {"Learning Rate": 0.5})
      writer.add(3, {"Learning Rate": 0.25})
      writer.close()
    warn.assert_called_once_with(
        "the TensorBoard scalars %s can no longer be written (No space left "
        "on device); the file keeps the epochs written before, and the "
        "training goes on" % writer.path)


if __name__ == "__main__":
  tf.test.main()
