"""Runs ptb_word_lm.py as a local cluster of ps and worker processes.

  python run_local_cluster.py --num_ps=1 --num_workers=2 -- \
      --data_path=simple-examples/data --model=test --num_gpus=0

Every task listens on 127.0.0.1 at a free port. Their output is streamed
with a prefix ([ps0], [worker0], ...); the launcher exits with the chief's
(worker 0's) exit status. SIGINT and SIGTERM are passed on to every task.
"""

import os
import signal
import socket
import subprocess
import sys
import threading

from absl import flags

from ptb import config as config_lib
from ptb import errors
from ptb.errors import UserError

flags.DEFINE_integer("num_ps", 1, "Parameter-server tasks.")
flags.DEFINE_integer("num_workers", 2, "Worker tasks; worker 0 is the chief.")
flags.DEFINE_float("grace", 30.0,
                   "Seconds the other tasks get to finish after the chief.")

FLAGS = flags.FLAGS
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "ptb_word_lm.py")
# The numeric flags' ranges (see config.FLAG_RANGES).
_FLAG_RANGES = {"num_ps": (1, True), "num_workers": (1, True),
                "grace": (0, True)}
# ptb_word_lm.py's flags that the launcher gives each task itself.
_TASK_FLAGS = ("job_name", "task_index", "ps_hosts", "worker_hosts")


def free_ports(count):
  """Ports that are free on 127.0.0.1 now (held open together, then freed)."""
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket()
      s.bind(("127.0.0.1", 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _stream(proc, prefix):
  for line in proc.stdout:
    sys.stdout.write("[%s] %s" % (prefix, line))
    sys.stdout.flush()


def launch(num_ps, num_workers, args):
  """Starts the tasks; returns [(name, Popen)], ps tasks first."""
  ports = free_ports(num_ps + num_workers)
  hosts = ["127.0.0.1:%d" % p for p in ports]
  cluster = ["--ps_hosts=" + ",".join(hosts[:num_ps]),
             "--worker_hosts=" + ",".join(hosts[num_ps:])]
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.pop("TF_CONFIG", None)  # The flags describe this cluster.
  tasks = []
  for job, count in (("ps", num_ps), ("worker", num_workers)):
    for i in range(count):
      proc = subprocess.Popen(
          [sys.executable, SCRIPT] + list(args) + cluster +
          ["--job_name=" + job, "--task_index=%d" % i],
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
          env=env)
      name = "%s%d" % (job, i)
      print("[launcher] %s pid %d at %s" % (name, proc.pid,
                                            hosts[len(tasks)]), flush=True)
      threading.Thread(target=_stream, args=(proc, name), daemon=True).start()
      tasks.append((name, proc))
  return tasks


def check_args(args):
  """Refuses the launcher's flags out of range, before any task starts.

  Args:
    args: ptb_word_lm.py's arguments; they may not set what the launcher
      sets for each task (a task's flags would contradict the cluster).
  """
  config_lib.check_absl_flags(FLAGS, _FLAG_RANGES)
  for arg in args:
    name = arg.lstrip("-").split("=", 1)[0]
    if arg.startswith("-") and name in _TASK_FLAGS:
      raise UserError("%s: the launcher sets --%s for each task; leave it "
                      "out" % (arg, name), exit_code=2)


def main(argv):
  check_args(argv[1:])
  tasks = launch(FLAGS.num_ps, FLAGS.num_workers, argv[1:])

  def forward(signum, _):
    for _, proc in tasks:
      if proc.poll() is None:
        proc.send_signal(signum)

  signal.signal(signal.SIGINT, forward)
  signal.signal(signal.SIGTERM, forward)
  chief = dict(tasks)["worker0"]
  status = chief.wait()
  for name, proc in tasks:
    try:
      proc.wait(timeout=FLAGS.grace)
    except subprocess.TimeoutExpired:
      print("[launcher] %s still running %.0f s after the chief: killed"
            % (name, FLAGS.grace), flush=True)
      proc.kill()
      proc.wait()
  print("[launcher] exit statuses: %s" % ", ".join(
      "%s=%d" % (name, proc.returncode) for name, proc in tasks), flush=True)
  return status


if __name__ == "__main__":
  errors.run_main(main, graph_mode=False)
