"""Nothing lost, no surprises: outputs checked first, failed writes survived,
damaged checkpoints skipped, one run per save_path, flag ranges.

The runs are ptb_word_lm.main's in this test's process
(ptb_word_lm_testing.run_in_process), but where only a real process of
ptb_word_lm.py shows it: a limit on the size of its files, a lock held by
another process, a real signal.
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
from unittest import mock

import tensorflow as tf

from ptb import checkpoint
from ptb import config as config_lib
from ptb import errors
from ptb import monitor
from ptb import outputs
from ptb import tensorboard
from ptb import testing
from ptb.errors import UserError
import ptb_word_lm
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


def warnings(err):
  """The warning lines of a run's stderr."""
  return [line for line in err.splitlines() if ": warning: " in line]


def limit_file_size(max_bytes):
  """A preexec_fn: no file of the child may grow past `max_bytes`."""
  def apply():
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
  return apply


# Takes the --save_path lock as a run does, says so, and waits to be killed.
_LOCK_HOLDER = """
import sys, time
from ptb import outputs
outputs.lock(sys.argv[1])
print("locked", flush=True)
time.sleep(3600)
"""


class OutputsTest(ptb_word_lm_testing.InProcessRunTest):
  """What a run writes, on InProcessRunTest's corpus (67 steps an epoch).

  Attributes:
    two_epochs: the save_path of a run of 2 epochs, with a checkpoint after
      each; the tests that damage checkpoints do it to a copy.
    two_epochs_test: the test perplexity of that run.
    tmp: the test's own directory (of `save` and `summary`).
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._runs = tempfile.TemporaryDirectory()
    cls.two_epochs = os.path.join(cls._runs.name, "two_epochs")
    out, err, stop = ptb_word_lm_testing.run_in_process(
        testing.learning_args(cls.data, "max_max_epoch=2") +
        ["--save_path=" + cls.two_epochs])
    assert stop is None, err
    cls.two_epochs_test = final_test_perplexity(out)
    # The real processes run without the kernels, whose build would write
    # files past the size limits that some of them are given.
    cls.env = dict(os.environ, PTB_LSTM_KERNELS="0")

  @classmethod
  def tearDownClass(cls):
    cls._runs.cleanup()
    super().tearDownClass()

  def command(self, overrides="", *extra):
    """learning_args on the corpus with `overrides`, then `extra` flags."""
    return testing.learning_args(self.data, overrides) + list(extra)

  def run_main(self, *args, run_epoch=None):
    """main with the command line `args`, in this process; see run_in_process.

    Returns:
      (stdout, stderr, the Stop that ended the run or None).
    """
    return ptb_word_lm_testing.run_in_process(args, run_epoch)

  def run_script(self, *args, preexec_fn=None):
    """A real process of ptb_word_lm.py; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, testing.SCRIPT] + list(args),
                          capture_output=True, text=True, cwd=testing.HERE,
                          env=self.env, preexec_fn=preexec_fn)
    return proc.returncode, proc.stdout, proc.stderr

  def assertRefused(self, args, pattern, code=1, untouched=None):
    """main stops with UserError `code`: one line, all of it `pattern`.

    Nothing under the directory `untouched` changes.
    """
    before = checksums(untouched) if untouched else None
    out, _, stop = self.run_main(*args)
    self.assertIsInstance(stop, UserError, out)
    self.assertEqual(stop.exit_code, code)
    self.assertRegex(str(stop), "^(%s)$" % pattern)
    self.assertNotIn("Epoch", out)
    if untouched:
      self.assertEqual(checksums(untouched), before)

  def copy_of_two_epochs(self):
    """The test's save_path, a copy of two_epochs; returns its checkpoints."""
    shutil.copytree(self.two_epochs, self.save)
    paths = list(tf.train.get_checkpoint_state(
        self.save).all_model_checkpoint_paths)
    self.assertLen(paths, 2)
    return paths

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
      self.assertRefused(self.command("", "--%s=%s" % (flag, value)), pattern,
                         untouched=self.tmp)
    self.assertEqual(os.listdir(a_dir), [])

  def testMissingParentsOfOutputsAreCreated(self):
    log = os.path.join(self.tmp, "new", "sub", "m.csv")
    summary = os.path.join(self.tmp, "other", "s.json")
    out, err, stop = self.run_main(*self.command(
        "max_max_epoch=1", "--memory_log=" + log, "--summary_json=" + summary))
    self.assertIsNone(stop, err)
    self.assertIn("Test Perplexity", out)
    with open(log) as f:
      self.assertEqual(f.readline(), "seconds,rss_mib,phase,epoch,step\n")
    with open(summary) as f:
      self.assertEqual(json.load(f)["status"], "finished")

  # 2. Writes that fail during a run never cost the run.

  def testSummaryDirectoryRemovedMidRun(self):
    sub = os.path.join(self.tmp, "sub")
    summary = os.path.join(sub, "s.json")
    real_run_epoch = ptb_word_lm.run_epoch
    train_passes, epochs_written = [], []

    def run_epoch(session, model, eval_op=None, **kwargs):
      if eval_op is not None:
        train_passes.append(model)
        if len(train_passes) == 2:
          # In epoch 2, after the summary of epoch 1 was written.
          with open(summary) as f:
            epochs_written.append(len(json.load(f)["epochs"]))
          shutil.rmtree(sub)
      return real_run_epoch(session, model, eval_op, **kwargs)

    out, err, stop = self.run_main(
        *self.command("", "--summary_json=" + summary,
                      "--save_path=" + self.save), run_epoch=run_epoch)
    self.assertEqual(epochs_written, [1])
    self.assertIsNone(stop, err)
    self.assertIn("Test Perplexity", out)
    self.assertEqual(warnings(err), [])
    # Every checkpoint was saved, and the next summary recreated its
    # directory and wrote the whole run again.
    self.assertEqual(checkpoint.read_progress(
        tf.train.latest_checkpoint(self.save))[:2], (3, 0))
    with open(summary) as f:
      written = json.load(f)
    self.assertEqual(written["status"], "finished")
    self.assertEqual([e["epoch"] for e in written["epochs"]], [1, 2, 3])

  def testMemoryLogThatStopsGrowingStopsAloneWithAWarning(self):
    log = os.path.join(self.tmp, "m.csv")
    # Files may not grow past 512 bytes: the memory log, sampled every 10 ms
    # (a row is about 25 bytes), reaches that early; the run writes nothing
    # else.
    code, out, err = self.run_script(
        *self.command("max_max_epoch=1", "--memory_log=" + log,
                      "--memory_interval=0.01"),
        preexec_fn=limit_file_size(512))
    self.assertEqual(code, 0, err)
    self.assertIn("Test Perplexity", out)
    self.assertLessEqual(os.path.getsize(log), 512)
    (warning,) = warnings(err)
    self.assertRegex(warning, r"^ptb_word_lm\.py: warning: the memory log "
                     r".*m\.csv can no longer be written \(File too large\); "
                     r"it keeps the rows written before and stops there, the "
                     r"training goes on$")
    self.assertNotIn("Traceback", err)

  def testCheckpointsThatCannotBeSavedCostNothingElse(self):
    save = self.save
    first, err, stop = self.run_main(*self.command("max_max_epoch=1",
                                                   "--save_path=" + save))
    self.assertIsNone(stop, err)
    good = tf.train.latest_checkpoint(save)
    before = checksums(save)
    # The disk is "full" for the next checkpoints: no file of the real
    # process may grow past half of a checkpoint's data file, the first
    # file a save writes.
    limit = os.path.getsize(good + ".data-00000-of-00001") // 2
    code, out, err = self.run_script(
        *self.command("max_max_epoch=3", "--save_path=" + save),
        preexec_fn=limit_file_size(limit))
    # The run trains and tests to the end, and its status says it is not
    # saved.
    self.assertEqual(code, 1, out + err)
    self.assertIn("Epoch: 3 Valid Perplexity", out)
    self.assertIn("Test Perplexity", out)
    self.assertNotIn("Traceback", err)
    failed = (r"saving a checkpoint to .*save failed \(File too large\); the "
              r"last good checkpoint is %s" % re.escape(good))
    self.assertLen(warnings(err), 2, err)   # after epochs 2 and 3
    for line in warnings(err):
      self.assertRegex(line, r"^ptb_word_lm\.py: warning: %s; the training "
                       r"goes on, and the next save tries again$" % failed)
    self.assertRegex(err, r"\nptb_word_lm\.py: error: the run is finished, "
                     r"but its end is not saved: %s\n$" % failed)
    # The good checkpoint is intact and still the one a run resumes from:
    # with no epoch left, it tests the weights that the first run tested.
    after = checksums(save)
    for name in before:
      if not name.startswith("events."):
        self.assertEqual(after.get(name), before[name], name)
    self.assertEqual(tf.train.latest_checkpoint(save), good)
    out, err, stop = self.run_main(*self.command("max_max_epoch=1",
                                                 "--save_path=" + save))
    self.assertIsNone(stop, err)
    self.assertIn("Resuming from epoch 2 step 0 of %s\n" % save, out)
    self.assertEqual(final_test_perplexity(out), final_test_perplexity(first))

  # 3. Damaged checkpoints are survived.

  def testTruncatedCheckpointIsSkippedForThePreviousOne(self):
    _, newest = self.copy_of_two_epochs()
    data_file = newest + ".data-00000-of-00001"
    with open(data_file, "r+b") as f:
      f.truncate(os.path.getsize(data_file) // 2)
    before = checksums(self.save)
    out, err, stop = self.run_main(*self.command(
        "max_max_epoch=2", "--save_path=" + self.save))
    self.assertIsNone(stop, err)
    (warning,) = warnings(err)
    self.assertRegex(warning, r"^ptb_word_lm\.py: warning: skipping the "
                     r"checkpoint %s, which cannot be read \(.*\)$"
                     % re.escape(newest))
    self.assertIn("Resuming from epoch 2 step 0 of %s\n" % self.save, out)
    # Epoch 2 trained again from epoch 1's checkpoint, as the first time.
    self.assertEqual(final_test_perplexity(out), self.two_epochs_test)
    # Nothing of the earlier run was deleted or overwritten.
    after = checksums(self.save)
    for name, digest in before.items():
      if name != "checkpoint":
        self.assertEqual(after.get(name), digest, name)

  def testMissingAndDamagedFilesOfEveryCheckpoint(self):
    older, newest = self.copy_of_two_epochs()
    os.remove(older + ".index")
    with open(newest + ".index", "r+b") as f:
      f.seek(10)
      f.write(b"\xff" * 16)
    self.assertRefused(
        self.command("max_max_epoch=2", "--save_path=" + self.save),
        r"no checkpoint in .*save can be read .*; move the damaged files out "
        r"of it to start afresh there, or use another --save_path",
        untouched=self.save)

  # 4. One run per save_path: the lock is another process's.

  def testSecondRunOnTheSameSavePathRefusesAtOnce(self):
    save = self.save
    # Longer than the test: it is stopped by a signal once checked.
    first, lines = testing.start_run(
        self.command("max_max_epoch=1000", "--save_path=" + save), self.env)
    self.addCleanup(first.kill)
    before = set(os.listdir(save))
    testing.assert_user_error(
        self, self.command("max_max_epoch=1000", "--save_path=" + save),
        r"--save_path=.*save is in use by another run \(process %d\); wait "
        r"for it to end, or use another --save_path" % first.pid,
        env=self.env)
    # The refusal came at once: the first run goes on, undisturbed (a
    # second run that waited for the lock would wait for its end).
    self.assertIsNone(first.poll())
    # Whatever is new in the directory is the first run's: its epochs'
    # checkpoints, TensorBoard events and checkpoint index, the latter with
    # the temporary file TensorFlow writes it through when caught mid-save
    # (the second run wrote nothing).
    new = set(os.listdir(save)) - before
    self.assertTrue(all(n.startswith(("model.ckpt-", "events.",
                                      "checkpoint.tmp")) or
                        n == "checkpoint" for n in new), new)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate()
    out = "".join(lines) + out
    self.assertEqual(first.returncode, 130, err)
    self.assertRegex(err, r"interrupted by SIGINT .*checkpoint saved to")
    self.assertNotIn("Resuming", out)
    # A crashed holder blocks nobody: the kernel dropped its lock.
    holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, save],
                              stdout=subprocess.PIPE, text=True,
                              cwd=testing.HERE)
    self.addCleanup(holder.kill)
    self.assertEqual(holder.stdout.readline(), "locked\n")
    with self.assertRaisesRegex(UserError, r"in use by another run "
                                r"\(process %d\)" % holder.pid):
      outputs.SavePathLock(save).acquire()
    holder.kill()
    holder.communicate()
    outputs.SavePathLock(save).acquire().release()

  # 5. Every numeric flag's range.

  def testFlagRanges(self):
    bad = {"eval_unroll": 0, "memory_interval": 0.0, "save_every_steps": -1,
           "cluster_timeout": 0.0, "original_summary_secs": -1.0,
           "intra_op_threads": -1, "original_norm_threads": -1,
           "inter_op_threads": -1, "task_index": -1, "seed": -1,
           "num_gpus": -1, "cpu_towers": 0}
    self.assertCountEqual(bad, config_lib.FLAG_RANGES)
    for flag, value in bad.items():
      with self.assertRaisesRegex(UserError, r"--%s=\S+ must be" % flag) as e:
        config_lib.check_flag_ranges({flag: value})
      self.assertEqual(e.exception.exit_code, 2)
    # Through main (which passes every flag of FLAG_RANGES), an int flag
    # and a float one.
    for flag, value, pattern in (
        ("seed", "-1", r"--seed=-1 must be 0 or more"),
        ("memory_interval", "0", r"--memory_interval=0\.0 must be positive")):
      self.assertRefused(self.command("", "--%s=%s" % (flag, value)),
                         pattern, code=2)
    # The intervals in seconds stop at a day: infinity broke the sampler's
    # clock, and NaN lies below every lowest.
    for flag in ("memory_interval", "original_summary_secs",
                 "cluster_timeout"):
      for value, pattern in (("inf", r"--%s=inf must be at most 86400\.0"),
                             ("nan", r"--%s=nan must be ")):
        self.assertRefused(self.command("", "--%s=%s" % (flag, value)),
                           pattern % flag + ".*", code=2)

  # 6. Two outputs that name one file.

  def testTwoOutputsThatNameOneFileAreRefused(self):
    save = os.path.join(self.tmp, "save")
    other = os.path.join(self.tmp, "sub", "..", "run.out")
    os.makedirs(os.path.join(self.tmp, "sub"))
    link = os.path.join(self.tmp, "link.out")
    with open(os.path.join(self.tmp, "run.out"), "w") as f:
      f.write("an earlier run's output\n")
    os.symlink(os.path.join(self.tmp, "run.out"), link)
    hard = os.path.join(self.tmp, "hard.csv")
    with open(os.path.join(self.tmp, "first.csv"), "w") as f:
      f.write("x\n")
    os.link(os.path.join(self.tmp, "first.csv"), hard)
    for flags, pattern in (
        (["--summary_json=" + os.path.join(self.tmp, "run.out"),
          "--memory_log=" + other], "--memory_log=.* and --summary_json=.* "
         "name the same file; give each output its own"),
        (["--summary_json=" + link, "--memory_log=" + other],
         "--memory_log=.* and --summary_json=.* name the same file.*"),
        (["--summary_json=" + os.path.join(self.tmp, "first.csv"),
          "--memory_log=" + hard], ".* name the same file.*"),
        (["--save_path=" + save, "--memory_log=" + save + "/"],
         "--memory_log=.* is the --save_path directory; give the file "
         "another name"),
        (["--save_path=" + save, "--summary_json=" + save + "/checkpoint"],
         "--summary_json=.*/checkpoint is a name the run writes in "
         "--save_path=.*; give the file another name"),
        (["--save_path=" + save, "--memory_log=" + save + "/model.ckpt-1.index"],
         "--memory_log=.* is a name the run writes in --save_path=.*")):
      with self.subTest(flags=flags):
        self.assertRefused(self.command("", *flags), pattern, code=2,
                           untouched=self.tmp)

  # The message of an interrupted run without --save_path says the truth.

  def testInterruptWithoutSavePathSaysNothingCanBeResumed(self):
    _, _, stop = self.run_main(
        *self.command("max_max_epoch=6"),
        run_epoch=ptb_word_lm_testing.interrupting(5, signal.SIGINT))
    self.assertEqual(stop.exit_code, 130)
    self.assertEqual(str(stop), "interrupted by SIGINT in the train pass of "
                     "epoch 1 at step 5 (nothing saved: without --save_path "
                     "a run cannot be resumed; add --save_path=DIR to make "
                     "the next run resumable)")


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
    return out, ptb_word_lm_testing.without_plan(err).splitlines(), stop

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
    self.assertNotIn("Saving model to", out)
    self.assertIsInstance(stop, UserError)
    self.assertEqual(stop.exit_code, 1)
    self.assertEqual(str(stop), "the run is finished, but its end is not "
                     "saved: " + failed)
    with open(self.summary) as f:
      summary = json.load(f)
    self.assertEqual(summary["status"], "failed")
    self.assertIsNotNone(summary["test_perplexity"])
    # The failed saves' temporary files, which fill a full disk, are gone.
    self.assertEqual([n for n in os.listdir(self.save) if ".tempstate" in n
                      or n.startswith("checkpoint.tmp")], [])

  def testAfterAFullDiskTheNextRunRecordsTheEndAtOnce(self):
    # The disk fills up once epoch 1 is saved: every later write fails, the
    # summary's last one too, so the file is left at "running".
    real_save, real_write = tf.compat.v1.train.Saver.save, (
        monitor.write_json_atomic)
    full = []

    def save(saver, session, prefix, **kwargs):
      if full:
        raise no_space_error(prefix)
      full.append(prefix)
      return real_save(saver, session, prefix, **kwargs)

    def write_json_atomic(path, obj):
      if full:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      real_write(path, obj)

    with mock.patch.object(tf.compat.v1.train.Saver, "save", autospec=True,
                           side_effect=save), \
        mock.patch.object(monitor, "write_json_atomic", write_json_atomic):
      _, err, stop = ptb_word_lm_testing.run_in_process(
          self.args("max_max_epoch=2"))
    self.assertRegex(str(stop), "^the run is finished, but its end is not "
                     "saved")
    self.assertTrue(err.splitlines()[-1].endswith(
        "could not be finished (No space left on device): it keeps its last "
        "complete version, whose status is still running; the next run on "
        "this --save_path records it as interrupted"), err)
    with open(self.summary) as f:
      self.assertEqual(json.load(f)["status"], "running")
    # Room again: by the next run's first step, the end is recorded.
    statuses = []
    real_run_epoch = ptb_word_lm.run_epoch

    def run_epoch(session, model, eval_op=None, **kwargs):
      if eval_op is not None:
        with open(self.summary) as f:
          statuses.append(json.load(f)["status"])
      return real_run_epoch(session, model, eval_op, **kwargs)

    out, err, stop = ptb_word_lm_testing.run_in_process(
        self.args("max_max_epoch=2"), run_epoch)
    self.assertIsNone(stop, err)
    self.assertIn("Resuming from epoch 2 step 0", out)
    self.assertEqual(statuses, ["interrupted"])
    with open(self.summary) as f:
      summary = json.load(f)
    self.assertEqual(summary["status"], "finished")
    self.assertEqual([e["epoch"] for e in summary["epochs"]], [1, 2])

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
