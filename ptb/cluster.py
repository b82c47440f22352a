"""Multi-process training on TensorFlow's distributed runtime (gRPC).

Classic TF1 between-graph replication: parameter-server (ps) tasks hold the
variables, every worker builds the same graph with a replica_device_setter,
and util.synchronous_update averages all workers' gradients into one update
per step. This module holds the plumbing with explicit arguments; it reads no
flags.
"""

import collections
import json
import socket
import time

import tensorflow as tf

from ptb.errors import UserError

Cluster = collections.namedtuple(
    "Cluster", ("job_name", "task_index", "ps_hosts", "worker_hosts"))


class ClusterError(UserError):
  """The cluster is misconfigured or a task was lost; one line says which."""

  def __init__(self, message):
    super().__init__(message, exit_code=2)


def _hosts(text):
  return [h.strip() for h in (text or "").split(",") if h.strip()]


def from_flags(job_name, task_index, ps_hosts, worker_hosts, tf_config=None):
  """The cluster this process belongs to, or None for a single process.

  Args:
    job_name, task_index, ps_hosts, worker_hosts: the classic TF1 flags
      (hosts as comma-separated host:port).
    tf_config: the TF_CONFIG environment variable's text, used when the
      flags give no cluster: {"cluster": {"ps": [...], "worker": [...]},
      "task": {"type": "worker", "index": 0}}.

  Raises:
    ClusterError: an incomplete or inconsistent description.
  """
  if not (job_name or ps_hosts or worker_hosts) and tf_config:
    try:
      spec = json.loads(tf_config)
      job_name = spec["task"]["type"]
      task_index = int(spec["task"]["index"])
      ps_hosts = ",".join(spec["cluster"].get("ps", []))
      worker_hosts = ",".join(spec["cluster"].get("worker", []))
    except (ValueError, KeyError, TypeError) as e:
      raise ClusterError("TF_CONFIG is not a valid cluster description (%s: "
                         "%s)" % (type(e).__name__, e)) from None
  if not (job_name or ps_hosts or worker_hosts):
    return None
  ps, workers = _hosts(ps_hosts), _hosts(worker_hosts)
  if job_name not in ("ps", "worker"):
    raise ClusterError("--job_name=%s: must be ps or worker" % job_name)
  if not ps or not workers:
    raise ClusterError("a cluster needs --ps_hosts and --worker_hosts "
                       "(comma-separated host:port)")
  tasks = ps if job_name == "ps" else workers
  if not 0 <= task_index < len(tasks):
    raise ClusterError("--task_index=%d but there are %d %s tasks"
                       % (task_index, len(tasks), job_name))
  return Cluster(job_name, task_index, ps, workers)


def is_chief(cluster):
  return cluster.job_name == "worker" and cluster.task_index == 0


def worker_device(cluster):
  return "/job:worker/task:%d" % cluster.task_index


def start_server(cluster):
  """Starts this task's gRPC server."""
  spec = tf.train.ClusterSpec({"ps": cluster.ps_hosts,
                               "worker": cluster.worker_hosts})
  return tf.compat.v1.train.Server(spec, job_name=cluster.job_name,
                                   task_index=cluster.task_index, start=True)


def device_setter(cluster):
  """Variables on the ps tasks (round robin), everything else on this worker."""
  spec = tf.train.ClusterSpec({"ps": cluster.ps_hosts,
                               "worker": cluster.worker_hosts})
  return tf.compat.v1.train.replica_device_setter(
      worker_device=worker_device(cluster), cluster=spec)


def session_config(cluster, base, timeout):
  """A worker's session config: only ps and itself, bounded blocking ops.

  Without the device filter a worker's session would wait for every other
  worker to come up; without the timeout a worker whose peers died would
  block forever on the token queue of the synchronous update.
  """
  config = tf.compat.v1.ConfigProto()
  config.CopyFrom(base)
  config.device_filters[:] = ["/job:ps", worker_device(cluster)]
  config.operation_timeout_in_ms = int(timeout * 1000)
  return config


def reachable(host, timeout=1.0):
  """Whether something accepts TCP connections at host:port."""
  name, _, port = host.rpartition(":")
  try:
    with socket.create_connection((name, int(port)), timeout=timeout):
      return True
  except (OSError, ValueError):
    return False


def wait_for(hosts, what, timeout):
  """Waits until every host accepts connections; ClusterError after timeout."""
  deadline = time.time() + timeout
  for i, host in enumerate(hosts):
    while not reachable(host):
      if time.time() > deadline:
        raise ClusterError("cannot reach %s task %d at %s within %.0f s: is "
                           "it running?" % (what, i, host, timeout))
      time.sleep(0.2)


def _done_queue(ps_index, num_workers):
  with tf.device("/job:ps/task:%d" % ps_index):
    return tf.queue.FIFOQueue(num_workers, tf.int32, shapes=[[]],
                              shared_name="done_queue_%d" % ps_index)


def done_ops(cluster):
  """Ops by which a worker tells every ps task it has finished."""
  return [_done_queue(i, len(cluster.worker_hosts)).enqueue(
      cluster.task_index) for i in range(len(cluster.ps_hosts))]


def ps_task_done(cluster, timeout, save_every_steps):
  """Runs this process's ps task to its end, if it is one.

  Returns:
    True for a ps task, once its workers are done; False for a worker or a
    single process. A worker is refused --save_every_steps: a cluster saves
    at the end of every epoch.
  """
  if cluster and cluster.job_name == "ps":
    run_ps(cluster, timeout)
    return True
  if cluster and save_every_steps:
    raise UserError("--save_every_steps is for one process: a cluster saves "
                    "at the end of every epoch", exit_code=2)
  return False


def run_ps(cluster, timeout, log=print):
  """Serves variables until every worker is done; returns when they are.

  A worker that is neither done nor reachable for `timeout` seconds is
  taken as lost: ClusterError, so that the ps does not wait forever.
  """
  server = start_server(cluster)
  num_workers = len(cluster.worker_hosts)
  with tf.Graph().as_default():
    queue = _done_queue(cluster.task_index, num_workers)
    size = queue.size()
    take = queue.dequeue_up_to(num_workers)
    config = tf.compat.v1.ConfigProto(
        device_filters=["/job:ps/task:%d" % cluster.task_index])
    with tf.compat.v1.Session(server.target, config=config) as session:
      done, last_seen = set(), {}
      started = time.time()
      while len(done) < num_workers:
        if session.run(size):
          done.update(int(i) for i in session.run(take))
          continue
        now = time.time()
        for w, host in enumerate(cluster.worker_hosts):
          if w in done:
            continue
          if reachable(host):
            last_seen[w] = now
          elif now - last_seen.get(w, started) > timeout:
            raise ClusterError(
                "ps task %d lost worker %d at %s: unreachable for %.0f s "
                "before it finished" % (cluster.task_index, w, host, timeout))
        time.sleep(0.5)
  log("ps task %d: all %d workers are done" % (cluster.task_index,
                                                num_workers))
