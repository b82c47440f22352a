"""Tests of multi-process training: cluster.py and run_local_cluster.py.

Every process listens on 127.0.0.1 only.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

import tensorflow as tf

from ptb import cluster as cluster_lib
from ptb import kernels
from ptb import testing
import ptb_word_lm_testing
from run_local_cluster import free_ports

LAUNCHER = os.path.join(testing.HERE, "run_local_cluster.py")
ERROR = "ptb_word_lm.py: error: "
# The seconds after --cluster_timeout by which every task left of a cluster
# that lost one has ended: a failed call returns at its deadline at the
# latest, the session's close gets cluster.CLOSE_WAIT_SECONDS, and the
# process's exit takes about 2 s on a busy 2-core machine.
MARGIN = 5
# A name under the reserved top-level domain .invalid: _no_dns keeps it from
# ever reaching a DNS server.
UNRESOLVABLE = "ptb-test.invalid"


def _no_dns():
  """socket.getaddrinfo patched to know numeric addresses only.

  A name fails at once as an unknown one does, so that no test sends a
  query off the machine (or waits for a resolver without a network).
  """
  real = socket.getaddrinfo

  def getaddrinfo(host, *args, **kwargs):
    try:
      socket.inet_pton(socket.AF_INET6 if ":" in str(host) else
                       socket.AF_INET, host)
    except (OSError, TypeError):
      raise socket.gaierror(socket.EAI_NONAME,
                            "Name or service not known") from None
    return real(host, *args, **kwargs)

  return mock.patch("socket.getaddrinfo", getaddrinfo)


def start(test, argv, stderr=subprocess.STDOUT, env=None):
  """Starts `argv` in the repository, output unbuffered on stdout's pipe.

  The process and its children are one process group of their own, killed
  when `test` ends if anything of it is still running (a failed test).

  Args:
    test: the running test.
    argv: the command line.
    stderr: where its stderr goes (a pipe of its own, or stdout's).
    env: variables added to the environment.
  """
  proc = subprocess.Popen(
      argv, stdout=subprocess.PIPE, stderr=stderr, text=True,
      cwd=testing.HERE, start_new_session=True,
      env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))

  def clean_up():
    kill_group(proc)
    proc.communicate()
  test.addCleanup(clean_up)
  return proc


def launch(test, args):
  """Starts run_local_cluster.py with `args`; its output on stdout, merged."""
  return start(test, [sys.executable, LAUNCHER] + args)


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

  Returns:
    ([(seconds, line)], seconds): each line with the time from now to its
    arrival, and the time to the process's end.
  """
  begun = time.time()
  watchdog = threading.Timer(timeout, kill_group, [proc])
  watchdog.start()
  try:
    rest = [(time.time() - begun, line) for line in proc.stdout]
    proc.wait()
  finally:
    watchdog.cancel()
  return rest, time.time() - begun


def error_lines(text, task=None):
  """The error lines in `text`; the launcher's `task`'s ("worker0") if given."""
  prefix = ("[%s] " % task if task else "") + ERROR
  return [l for l in text.splitlines() if l.startswith(prefix)]


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
        (("worker", 0, "a", "b:1"), "ps task 0: a is not host:port"),
        (("ps", 0, "a:1", "b:1,c:0"), "worker task 1: c:0 is not host:port"),
        ((None, 0, None, None, "{not json"), "TF_CONFIG is not a valid")):
      with self.assertRaisesRegex(cluster_lib.ClusterError, pattern):
        cluster_lib.from_flags(*args)


class LostTest(tf.test.TestCase):
  """The message of a worker that lost the cluster names the task lost."""

  def setUp(self):
    super().setUp()
    # Nothing listens at these: each refuses connections.
    self.ps, self.worker0, self.worker1 = [
        "127.0.0.1:%d" % p for p in free_ports(3)]
    self.cluster = cluster_lib.Cluster("worker", 1, [self.ps],
                                       [self.worker0, self.worker1])

  def testTheTaskThatTheErrorNames(self):
    # Worker 1's error when the ps was killed in a step (TensorFlow 2.21):
    # two errors, the first from worker 1 itself, both about the ps.
    error = tf.errors.UnavailableError(None, None, (
        "Graph execution error:\n\n=====================\n"
        "UNAVAILABLE: From /job:worker/replica:0/task:1:\n"
        "recvmsg:Connection reset by peer\n"
        "Additional GRPC error information from remote target "
        "/job:ps/replica:0/task:0 while calling "
        "/tensorflow.WorkerService/RecvTensor:\n"
        ":UNKNOWN:Error received from peer  {grpc_status:14}\n"
        "\t [[{{node Train/Model/tower_0/ReadVariableOp_S35}}]]\n"
        "UNAVAILABLE: From /job:ps/replica:0/task:0:\nSocket closed\n"
        "====================="))
    self.assertEqual(
        str(cluster_lib.lost(self.cluster, error, 15, " in the test")),
        "worker 1 lost the cluster in the test (UnavailableError: ps task 0 "
        "at %s: recvmsg:Connection reset by peer); a ps or worker task "
        "stopped, or made no progress within --cluster_timeout=15 s"
        % self.ps)

  def testADeadlineNamesATaskThatRefusesConnections(self):
    error = tf.errors.DeadlineExceededError(
        None, None, "Graph execution error:\n\nOperation timed out.")
    self.assertIn("(DeadlineExceededError: Operation timed out; ps task 0 "
                  "at %s: Connection refused)" % self.ps,
                  str(cluster_lib.lost(self.cluster, error, 15)))

  def testAPsThatDoesNotResolveIsNamedWithTheReason(self):
    host = "%s:%d" % (UNRESOLVABLE, free_ports(1)[0])
    with _no_dns(), self.assertRaisesRegex(
        cluster_lib.ClusterError,
        r"^cannot reach ps task 0 at %s within 1 s \(Name or service not "
        r"known\): is it running\?$" % re.escape(host)):
      cluster_lib.wait_for([host], "ps", 1)


class AddressTest(tf.test.TestCase):
  """A task that cannot listen at its address stops with one line at once."""

  def assertStopsWithOneLine(self, job_name, ps, worker, reason):
    """Runs task 0 of `job_name`; checks its one error line.

    Args:
      job_name: "ps" or "worker".
      ps, worker: the --ps_hosts and --worker_hosts, one task each.
      reason: a regular expression of the reason that the line ends with.
    """
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      # The kernels are no matter here: the worker stops before it trains.
      proc = start(self, [
          sys.executable, testing.SCRIPT, "--data_path=" + tmp,
          "--model=test", "--num_gpus=0", "--job_name=" + job_name,
          "--task_index=0", "--ps_hosts=" + ps, "--worker_hosts=" + worker],
                   stderr=subprocess.PIPE, env={"PTB_LSTM_KERNELS": "0"})
      out, err = proc.communicate(timeout=300)
    self.assertEqual(proc.returncode, 2, out + err)
    self.assertNotIn("Traceback", err)
    lines = error_lines(err)
    self.assertLen(lines, 1, err)
    self.assertRegex(lines[0], "^%s%s$" % (re.escape(
        "%s%s task 0 cannot listen at %s: " % (
            ERROR, job_name, ps if job_name == "ps" else worker)), reason))

  def testPortInUse(self):
    with socket.socket() as taken:
      taken.bind(("127.0.0.1", 0))
      taken.listen()
      port, = free_ports(1)
      self.assertStopsWithOneLine(
          "ps", "127.0.0.1:%d" % taken.getsockname()[1],
          "127.0.0.1:%d" % port, "Address already in use")

  def testHostNameThatDoesNotResolve(self):
    # In this process, so that the name is never sent to a DNS server; the
    # one line and exit status of such a reason: testPortInUse.
    ports = free_ports(2)
    ps = "%s:%d" % (UNRESOLVABLE, ports[0])
    cluster = cluster_lib.Cluster("ps", 0, [ps], ["127.0.0.1:%d" % ports[1]])
    with _no_dns(), self.assertRaisesRegex(
        cluster_lib.ClusterError,
        r"^ps task 0 cannot listen at %s: the host name %s does not resolve "
        r"\(Name or service not known\)$" % (re.escape(ps),
                                              re.escape(UNRESOLVABLE))):
      cluster_lib.start_server(cluster)

  def testAddressOfAnotherMachine(self):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: binding it fails
    # here, and nothing is ever sent to it.
    ports = free_ports(2)
    self.assertStopsWithOneLine(
        "worker", "127.0.0.1:%d" % ports[0], "192.0.2.1:%d" % ports[1],
        "Cannot assign requested address")


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

  def kill_when_worker1_trains(self, task, timeout, statuses):
    """Runs a ps and two workers; kills `task` once worker 1 trains.

    Checks that the chief (so the launcher) ends with exit status 1, with
    no traceback from any task.

    Args:
      task: the task to kill, by the launcher's name ("ps0").
      timeout: the --cluster_timeout, in seconds.
      statuses: the exit statuses that the launcher reports last.

    Returns:
      (output, hosts, ends): the launcher's output; every task's host:port
      by name; and the seconds from the kill to every task's error line, by
      name, and to the launcher's end ("launcher").
    """
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp, train_lines=8000)
      proc = launch(self, ["--num_ps=1", "--num_workers=2", "--grace=60",
                           "--", "--data_path=" + tmp, "--model=test",
                           "--num_gpus=0", "--cluster_timeout=%d" % timeout])
      lines, pids, hosts = [], {}, {}
      for line in proc.stdout:
        lines.append(line)
        match = re.match(r"\[launcher\] (\w+) pid (\d+) at (\S+)", line)
        if match:
          pids[match.group(1)] = int(match.group(2))
          hosts[match.group(1)] = match.group(3)
        if line.startswith("[worker1] 0.") and "wps" in line:
          break
      else:
        self.fail("the cluster stopped before worker 1 trained:\n%s"
                  % "".join(lines))
      os.kill(pids[task], signal.SIGKILL)
      rest, ended = rest_of_output(proc, 180)
    ends = {"launcher": ended}
    for seconds, line in rest:
      match = re.match(r"\[(\w+)\] " + re.escape(ERROR), line)
      if match:
        ends[match.group(1)] = seconds
    out = "".join(lines + [line for _, line in rest])
    self.assertEqual(proc.returncode, 1, out)
    self.assertIn("[launcher] exit statuses: " + statuses, out)
    self.assertNotIn("Traceback", out)
    return out, hosts, ends

  def testLosingAWorkerStopsTheOthersWithinTheTimeout(self):
    # The timeout is what the test waits once the worker is gone. It also
    # bounds how far the tasks' start-ups may drift apart (the ps waits for
    # the workers, worker 0's first step for worker 1's): all three start
    # together, with the kernels built (setUpClass), and drift by about a
    # second even on a busy 2-core machine. The timed part begins only once
    # worker 1 trains.
    timeout = 15
    out, hosts, ends = self.kill_when_worker1_trains(
        "worker1", timeout, "ps0=2, worker0=1, worker1=-9")
    # Each task that is left stops by itself (the ps with its own error,
    # not killed by the launcher after --grace), and only after the timeout:
    # the ps waits that long for the worker to come back (less the moment
    # between its last check and the kill), worker 0's step that long for
    # worker 1's gradient. Worker 0 hits its own deadline, and names the
    # task that refuses connections, or finds the ps gone, whichever comes
    # first: both end in the same one-line error.
    self.assertBetween(ends["launcher"], timeout - 3, timeout + MARGIN)
    self.assertLen(error_lines(out, "worker0"), 1, out)
    self.assertRegex(error_lines(out, "worker0")[0], (
        r"worker 0 lost the cluster in the train pass of epoch 1 \("
        r"(DeadlineExceeded|Unavailable)Error: .*(worker task 1 at %s|ps task "
        r"0 at %s): \w.*--cluster_timeout=%d s$"
        % (hosts["worker1"], hosts["ps0"], timeout)))
    self.assertEqual(error_lines(out, "ps0"), [
        "[ps0] %sps task 0 lost worker 1 at %s: unreachable for %d s before "
        "it finished (Connection refused)"
        % (ERROR, hosts["worker1"], timeout)], out)

  def testLosingThePsStopsTheWorkersWithinTheTimeout(self):
    # The workers see the ps gone at their next call, or in the middle of
    # the one running: far within the timeout, where TensorFlow alone would
    # wait 30 s to close each session.
    timeout = 15
    out, hosts, ends = self.kill_when_worker1_trains(
        "ps0", timeout, "ps0=-9, worker0=1, worker1=1")
    self.assertLess(ends["launcher"], timeout + MARGIN, (ends, out))
    for w in (0, 1):
      lines = error_lines(out, "worker%d" % w)
      self.assertLen(lines, 1, out)
      # The reason is TensorFlow's own ("Socket closed"), not its frame.
      self.assertRegex(lines[0], (
          r"worker %d lost the cluster in the train pass of epoch 1 \(\w+"
          r"Error: .*ps task 0 at %s: \w" % (w, hosts["ps0"])))
      self.assertNotIn("Graph execution error", lines[0])


if __name__ == "__main__":
  tf.test.main()
