"""Tests of multi-process training: cluster.py and run_local_cluster.py.

Every process listens on 127.0.0.1 only.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import tensorflow as tf

from ptb import cluster as cluster_lib
from ptb import kernels
from ptb import testing
import ptb_word_lm_testing

LAUNCHER = os.path.join(testing.HERE, "run_local_cluster.py")


def launch(test, args):
  """Starts run_local_cluster.py with `args`; its output on stdout, merged.

  The launcher and its tasks are one process group of their own, killed
  when `test` ends if anything of it is still running (a failed test).
  """
  proc = subprocess.Popen(
      [sys.executable, LAUNCHER] + args, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, cwd=testing.HERE,
      env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)

  def clean_up():
    kill_group(proc)
    proc.wait()
    proc.stdout.close()
  test.addCleanup(clean_up)
  return proc


def kill_group(proc):
  """Kills what is left of the process group that `proc` leads."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def rest_of_output(proc, timeout):
  """What `proc` writes until it exits; after `timeout` s, it is killed.

  Read from the same buffered stdout as the lines before it (communicate()
  would skip what that buffer holds).
  """
  watchdog = threading.Timer(timeout, kill_group, [proc])
  watchdog.start()
  try:
    rest = proc.stdout.read()
    proc.wait()
  finally:
    watchdog.cancel()
  return rest


class FromFlagsTest(tf.test.TestCase):

  def testNoClusterIsNone(self):
    self.assertIsNone(cluster_lib.from_flags(None, 0, None, None, None))

  def testFlags(self):
    c = cluster_lib.from_flags("worker", 1, "a:1", "b:2,c:3")
    self.assertEqual(c, cluster_lib.Cluster("worker", 1, ["a:1"], ["b:2", "c:3"]))
    self.assertFalse(cluster_lib.is_chief(c))
    self.assertTrue(cluster_lib.is_chief(c._replace(task_index=0)))

  def testTfConfig(self):
    tf_config = json.dumps({"cluster": {"ps": ["p:1"], "worker": ["w:1", "w:2"]},
                            "task": {"type": "worker", "index": 1}})
    self.assertEqual(cluster_lib.from_flags(None, 0, None, None, tf_config),
                     cluster_lib.Cluster("worker", 1, ["p:1"], ["w:1", "w:2"]))

  def testBadDescriptions(self):
    for args, pattern in (
        (("chief", 0, "a:1", "b:1"), "must be ps or worker"),
        (("worker", 2, "a:1", "b:1,c:1"), "task_index=2 but there are 2"),
        (("worker", 0, None, "b:1"), "needs --ps_hosts and --worker_hosts"),
        ((None, 0, None, None, "{not json"), "TF_CONFIG is not a valid")):
      with self.assertRaisesRegex(cluster_lib.ClusterError, pattern):
        cluster_lib.from_flags(*args)


class LocalClusterTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # The workers' LSTM kernels, built now if they are to be (conftest.py's
    # PTB_KERNEL_DIR): a cluster's workers would each build them as they
    # start (about 15 s, far more on a busy machine), within the timeouts
    # that the tasks give each other's start.
    kernels.load()

  def testTwoWorkersTrainLikeOneProcessWithDoubleBatch(self):
    with tempfile.TemporaryDirectory() as tmp:
      # A corpus that needs the LSTM state carried from step to step: a
      # worker that loses it, or trains on the other's rows, ends far above
      # LEARNED_TEST_PERPLEXITY; twice the default lines, for batch 40. (On
      # it, averaging the embedding's sparse gradients row by row made the
      # cluster end 15 % off the single process.)
      testing.make_structured_corpus(tmp, train_lines=3000)
      # The reference: one process, both workers' rows in one batch. It
      # runs here, in the test's process.
      single, err, stop = ptb_word_lm_testing.run_in_process(
          testing.learning_args(tmp, "batch_size=40", seed=5))
      self.assertIsNone(stop, err)
      # The timeout bounds a cluster that hangs; a passing one never waits
      # for it, and it leaves room for a task that starts late.
      proc = launch(self, ["--num_ps=1", "--num_workers=2", "--"] +
                    testing.learning_args(tmp, seed=5) +
                    ["--cluster_timeout=120"])
      out, _ = proc.communicate(timeout=600)
    self.assertEqual(proc.returncode, 0, out)
    self.assertIn("[ps0] ps task 0: all 2 workers are done", out)
    self.assertIn("exit statuses: ps0=0, worker0=0, worker1=0", out)
    for worker in ("worker0", "worker1"):
      self.assertRegex(out, r"\[%s\] 0\.\d{3} perplexity: \S+ speed: \d+ wps"
                       % worker)
    self.assertRegex(out, r"\[worker0\] Epoch: 1 Cluster speed: \d+ wps")
    self.assertNotRegex(out, r"\[worker1\] (Test|Epoch: 1 Valid)")
    got = float(re.search(r"\[worker0\] Test Perplexity: (\S+)", out).group(1))
    want = float(re.search(r"^Test Perplexity: (\S+)$", single,
                           re.MULTILINE).group(1))
    self.assertLess(got, testing.LEARNED_TEST_PERPLEXITY)
    self.assertAllClose(got, want, rtol=0.01, msg=out)

  def testLosingAWorkerStopsTheOthersWithinTheTimeout(self):
    # The timeout is what the test waits once the worker is gone. It also
    # bounds how far the tasks' start-ups may drift apart (the ps waits for
    # the workers, worker 0's first step for worker 1's): all three start
    # together, with the kernels built (setUpClass), and drift by about a
    # second even on a busy 2-core machine. The timed part begins only once
    # worker 1 trains.
    timeout = 15
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp, train_lines=8000)
      proc = launch(self, ["--num_ps=1", "--num_workers=2", "--grace=60",
                           "--", "--data_path=" + tmp, "--model=test",
                           "--num_gpus=0", "--cluster_timeout=%d" % timeout])
      lines, pids = [], {}
      for line in proc.stdout:
        lines.append(line)
        match = re.match(r"\[launcher\] (\w+) pid (\d+)", line)
        if match:
          pids[match.group(1)] = int(match.group(2))
        if line.startswith("[worker1] 0.") and "wps" in line:
          break
      else:
        self.fail("the cluster stopped before worker 1 trained:\n%s"
                  % "".join(lines))
      os.kill(pids["worker1"], signal.SIGKILL)
      killed = time.time()
      rest = rest_of_output(proc, 180)
      elapsed = time.time() - killed
    out = "".join(lines) + rest
    # Each task that is left stops by itself (the ps with its own error,
    # not killed by the launcher after --grace), and only after the timeout:
    # the ps waits that long for the worker to come back (less the moment
    # between its last check and the kill), worker 0's step that long for
    # worker 1's gradient. Worker 0 hits its own deadline or finds the ps
    # gone, whichever comes first: both end in the same one-line error.
    self.assertEqual(proc.returncode, 1, out)
    self.assertIn("[launcher] exit statuses: ps0=2, worker0=1, worker1=-9",
                  out)
    self.assertBetween(elapsed, timeout - 3, timeout + 30)
    self.assertNotIn("Traceback", out)
    self.assertRegex(out, r"\[worker0\] ptb_word_lm.py: error: worker 0 lost "
                     r"the cluster in the train pass of epoch 1 \("
                     r"(DeadlineExceeded|Unavailable)Error: "
                     r".*--cluster_timeout=%d s"
                     % timeout)
    self.assertRegex(out, r"\[ps0\] ptb_word_lm.py: error: ps task 0 lost "
                     r"worker 1 at 127\.0\.0\.1:\d+: unreachable for %d s "
                     r"before it finished" % timeout)


if __name__ == "__main__":
  tf.test.main()
