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
import time

import tensorflow as tf

from ptb import cluster as cluster_lib
from ptb import testing

LAUNCHER = os.path.join(testing.HERE, "run_local_cluster.py")


def launch(args, **kwargs):
  return subprocess.Popen(
      [sys.executable, LAUNCHER] + args, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, cwd=testing.HERE,
      env=dict(os.environ, PYTHONUNBUFFERED="1"), **kwargs)


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

  def testTwoWorkersTrainLikeOneProcessWithDoubleBatch(self):
    with tempfile.TemporaryDirectory() as tmp:
      # A corpus that needs the LSTM state carried from step to step: a
      # worker that loses it, or trains on the other's rows, ends far above
      # LEARNED_TEST_PERPLEXITY; twice the default lines, for batch 40. (On
      # it, averaging the embedding's sparse gradients row by row made the
      # cluster end 15 % off the single process.)
      testing.make_structured_corpus(tmp, train_lines=3000)
      common = ["--data_path=" + tmp, "--model=test", "--num_gpus=0",
                "--seed=5"]
      overrides = "--config_overrides=" + testing.LEARNING_OVERRIDES
      proc = launch(["--num_ps=1", "--num_workers=2", "--"] + common +
                    [overrides, "--cluster_timeout=120"])
      out, _ = proc.communicate(timeout=600)
      self.assertEqual(proc.returncode, 0, out)
      code, single, err = testing.run_script(
          *(common + [overrides + ",batch_size=40"]))
      self.assertEqual(code, 0, err)
    self.assertIn("[ps0] ps task 0: all 2 workers are done", out)
    self.assertIn("exit statuses: ps0=0, worker0=0, worker1=0", out)
    for worker in ("worker0", "worker1"):
      self.assertRegex(out, r"\[%s\] 0\.\d{3} perplexity: \S+ speed: \d+ wps"
                       % worker)
    self.assertRegex(out, r"\[worker0\] Epoch: 1 Cluster speed: \d+ wps")
    self.assertNotRegex(out, r"\[worker1\] (Test|Epoch: 1 Valid)")
    got = float(re.search(r"\[worker0\] Test Perplexity: (\S+)", out).group(1))
    want = float(re.search(r"Test Perplexity: (\S+)", single).group(1))
    self.assertLess(got, testing.LEARNED_TEST_PERPLEXITY)
    self.assertAllClose(got, want, rtol=0.01)

  def testLosingAWorkerStopsTheOthersWithinTheTimeout(self):
    # Long enough for three TensorFlow processes to start on a busy 2-core
    # machine; the whole test is still bounded by it.
    timeout = 30
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp, train_lines=8000)
      proc = launch(["--num_ps=1", "--num_workers=2", "--grace=60", "--",
                     "--data_path=" + tmp, "--model=test", "--num_gpus=0",
                     "--cluster_timeout=%d" % timeout])
      lines, pids = [], {}
      for line in proc.stdout:
        lines.append(line)
        match = re.match(r"\[launcher\] (\w+) pid (\d+)", line)
        if match:
          pids[match.group(1)] = int(match.group(2))
        if line.startswith("[worker1] 0.") and "wps" in line:
          break
      os.kill(pids["worker1"], signal.SIGKILL)
      killed = time.time()
      rest, _ = proc.communicate(timeout=180)
      elapsed = time.time() - killed
    out = "".join(lines) + rest
    self.assertNotEqual(proc.returncode, 0, out)
    self.assertLess(elapsed, timeout + 45, out)
    self.assertNotIn("Traceback", out)
    self.assertRegex(out, r"\[worker0\] ptb_word_lm.py: error: worker 0 lost "
                     r"the cluster in the train pass of epoch 1 .*"
                     r"--cluster_timeout=30 s")
    self.assertRegex(out, r"\[ps0\] ptb_word_lm.py: error: ps task 0 lost "
                     r"worker 1 at 127\.0\.0\.1:\d+")


if __name__ == "__main__":
  tf.test.main()
