"""Multi-process training on TensorFlow's distributed runtime (gRPC).

Classic TF1 between-graph replication: parameter-server (ps) tasks hold the
variables, every worker builds the same graph with a replica_device_setter,
and util.synchronous_update averages all workers' gradients into one update
per step. This module holds the plumbing with explicit arguments; it reads no
flags.
"""

import collections
import contextlib
import json
import re
import socket
import threading
import time

import tensorflow as tf

from ptb.errors import UserError

Cluster = collections.namedtuple(
    "Cluster", ("job_name", "task_index", "ps_hosts", "worker_hosts"))


class ClusterError(UserError):
  """The cluster is misconfigured or a task was lost; one line says which."""

  def __init__(self, message):
    super().__init__(message, exit_code=2)


# How long a failing task lets its session close. Closing asks every task
# the session ran on to free its part, and a task lost in the middle of a
# step never answers (TensorFlow's own context manager waits 30 s for it).
CLOSE_WAIT_SECONDS = 1.0

# The lines of a distributed OpError's message around its reasons: the
# frame of the failed call, the task each error came from (after its status
# code when there are several, between lines of "="), and gRPC's notes.
_MESSAGE_FRAME = ("Graph execution error", "From /job:", "Additional GRPC",
                  ":UNKNOWN:Error received", "[[", "Detected at node",
                  "Node:", "File ", "Hint:", "=")
_STATUS_CODE = re.compile(r"^[A-Z_]+: ")
_TASK_NAME = re.compile(r"/job:(ps|worker)/replica:\d+/task:(\d+)")


def _hosts(text):
  return [h.strip() for h in (text or "").split(",") if h.strip()]


def split_address(host):
  """(name, port) of a task's host:port; ValueError if it is not one."""
  name, _, port = host.rpartition(":")
  if not name or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError("%s is not host:port" % host)
  return name.strip("[]"), int(port)  # an IPv6 address comes in brackets


def _check_addresses(job_name, hosts):
  """ClusterError unless every task of `job_name` has a host:port."""
  for i, host in enumerate(hosts):
    try:
      split_address(host)
    except ValueError as e:
      raise ClusterError("%s task %d: %s" % (job_name, i, e)) from None


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
  _check_addresses("ps", ps)
  _check_addresses("worker", workers)
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


def own_address(cluster):
  """This task's host:port."""
  hosts = cluster.ps_hosts if cluster.job_name == "ps" else cluster.worker_hosts
  return hosts[cluster.task_index]


def start_server(cluster):
  """Starts this task's gRPC server.

  Raises:
    ClusterError: this task cannot listen at its address; the message names
      the task, the address and the reason.
  """
  task = "%s task %d" % (cluster.job_name, cluster.task_index)
  address = own_address(cluster)
  reason = listen_error(address)
  if reason:
    raise ClusterError("%s cannot listen at %s: %s" % (task, address, reason))
  spec = tf.train.ClusterSpec({"ps": cluster.ps_hosts,
                               "worker": cluster.worker_hosts})
  try:
    return tf.compat.v1.train.Server(spec, job_name=cluster.job_name,
                                     task_index=cluster.task_index,
                                     start=True)
  except tf.errors.OpError as e:  # the port taken since listen_error
    raise ClusterError("%s cannot listen at %s: %s"
                       % (task, address, error_reason(e))) from None


def listen_error(host):
  """Why this process cannot listen at host:port; None if it can.

  TensorFlow's server listens at the port on every interface and takes the
  host on trust: a name that does not resolve, or an address of another
  machine, would only show as peers that never reach this task. So the
  address itself is bound first, then the port on every interface.
  """
  name, port = split_address(host)
  try:
    found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
  except socket.gaierror as e:
    return "the host name %s does not resolve (%s)" % (name, e.strerror)
  errors = [(family, _bind_error(family, address))
            for family, _, _, _, address in found]
  bound = [family for family, error in errors if not error]
  if not bound:
    return errors[0][1]
  return _bind_error(bound[0], ("", port))


def _bind_error(family, address):
  """The text of the OSError of binding a TCP socket to `address`, or None."""
  try:
    with socket.socket(family, socket.SOCK_STREAM) as s:
      # As gRPC does: a port whose connections linger in TIME_WAIT is free.
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      s.bind(address)
  except OSError as e:
    return e.strerror or str(e)
  return None


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


def connect_error(host, timeout=1.0):
  """Why host:port accepts no TCP connection now; None if it does."""
  try:
    with socket.create_connection(split_address(host), timeout=timeout):
      return None
  except socket.timeout:
    return "no answer within %.0f s" % timeout
  except OSError as e:
    return e.strerror or str(e)


def wait_for(hosts, what, timeout):
  """Waits until every host accepts connections; ClusterError after timeout.

  The error gives the last attempt's reason (a refused connection, a name
  that does not resolve).
  """
  deadline = time.time() + timeout
  for i, host in enumerate(hosts):
    reason = connect_error(host)
    while reason:
      if time.time() > deadline:
        raise ClusterError("cannot reach %s task %d at %s within %.0f s (%s): "
                           "is it running?" % (what, i, host, timeout, reason))
      time.sleep(0.2)
      reason = connect_error(host)


def error_reason(error):
  """The line of an OpError's message that says what went wrong.

  A failed call's message starts with a frame ("Graph execution error:",
  "From /job:ps/replica:0/task:0:"), which holds no reason; gRPC's notes
  follow the reason. Of several errors, the first one's reason is taken.
  """
  lines = [l.strip() for l in (error.message or "").splitlines()]
  reasons = [l for l in lines
             if l and not _STATUS_CODE.sub("", l).startswith(_MESSAGE_FRAME)]
  return reasons[0].rstrip(".") if reasons else "no reason given"


def _failed_task(cluster, error):
  """The other task that `error` came from, as "ps task 0 at host:port".

  Returns:
    That text, or None if the error names no other task of the cluster.
  """
  for job, index in _TASK_NAME.findall(error.message or ""):
    index = int(index)
    hosts = cluster.ps_hosts if job == "ps" else cluster.worker_hosts
    if (job, index) != (cluster.job_name, cluster.task_index) and (
        index < len(hosts)):
      return "%s task %d at %s" % (job, index, hosts[index])
  return None


def _unreachable_task(cluster):
  """The first other task that accepts no connection, and why.

  Returns:
    As "worker task 1 at host:port: Connection refused", or None if every
    other task accepts connections.
  """
  for job, hosts in (("ps", cluster.ps_hosts),
                     ("worker", cluster.worker_hosts)):
    for index, host in enumerate(hosts):
      if (job, index) == (cluster.job_name, cluster.task_index):
        continue
      reason = connect_error(host)
      if reason:
        return "%s task %d at %s: %s" % (job, index, host, reason)
  return None


def lost(cluster, error, timeout, where=""):
  """The UserError of a worker whose session call failed in a cluster.

  Such a failure means that another task stopped or hung. The message
  names that task and its address when the error does; an error that names
  none (a deadline passed) gets the first task that accepts no connection.

  Args:
    cluster: this worker's Cluster.
    error: the OpError of the failed call.
    timeout: the --cluster_timeout, in seconds.
    where: where the run was, as " in the train pass of epoch 1".

  Returns:
    The UserError, one line.
  """
  reason = error_reason(error)
  task = _failed_task(cluster, error)
  if task:
    reason = "%s: %s" % (task, reason)
  else:
    reason = "; ".join(filter(None, [reason, _unreachable_task(cluster)]))
  return UserError(
      "worker %d lost the cluster%s (%s: %s); a ps or worker task stopped, "
      "or made no progress within --cluster_timeout=%.0f s"
      % (cluster.task_index, where, type(error).__name__, reason, timeout))


@contextlib.contextmanager
def task_session(server, config, graph=None):
  """A session on this task's server; a failure does not wait on its close.

  On an exception, the session is closed in a thread of its own for at
  most CLOSE_WAIT_SECONDS, and the exception goes on: the process is about
  to end, and a lost task would hold the close forever.

  Args:
    server: this task's tf.compat.v1.train.Server.
    config: the session's ConfigProto.
    graph: the session's graph; the default graph if None.

  Yields:
    The session, as the default session, its graph the default graph.
  """
  sess = tf.compat.v1.Session(server.target, graph=graph, config=config)
  try:
    with sess.graph.as_default(), sess.as_default():
      yield sess
  except BaseException:
    closing = threading.Thread(target=_close_quietly, args=(sess,),
                               name="SessionClose", daemon=True)
    closing.start()
    closing.join(CLOSE_WAIT_SECONDS)
    raise
  sess.close()


@contextlib.contextmanager
def worker_session(server, cluster, config, graph, timeout):
  """A worker's task_session, whose failed calls end as lost's UserError.

  Args:
    server: this worker's tf.compat.v1.train.Server.
    cluster: this worker's Cluster.
    config: the session's ConfigProto (session_config).
    graph: the session's graph.
    timeout: the --cluster_timeout, in seconds.

  Yields:
    The session, as task_session does.
  """
  with task_session(server, config, graph) as sess:
    try:
      yield sess
    except tf.errors.OpError as e:
      raise lost(cluster, e, timeout) from None


def _close_quietly(sess):
  try:
    sess.close()
  except tf.errors.OpError:
    pass  # the task is already ending with the error that made it close


def _done_queue(ps_index, num_workers):
  with tf.device("/job:ps/task:%d" % ps_index):
    return tf.queue.FIFOQueue(num_workers, tf.int32, shapes=[[]],
                              shared_name="done_queue_%d" % ps_index)


def done_ops(cluster):
  """Ops by which a worker tells every ps task it has finished."""
  return [_done_queue(i, len(cluster.worker_hosts)).enqueue(
      cluster.task_index) for i in range(len(cluster.ps_hosts))]


def serve_if_ps(cluster, timeout, save_every_steps):
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
    with task_session(server, config) as session:
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
          reason = connect_error(host)
          if not reason:
            last_seen[w] = now
          elif now - last_seen.get(w, started) > timeout:
            raise ClusterError(
                "ps task %d lost worker %d at %s: unreachable for %.0f s "
                "before it finished (%s)"
                % (cluster.task_index, w, host, timeout, reason))
        time.sleep(0.5)
  log("ps task %d: all %d workers are done" % (cluster.task_index,
                                                num_workers))
