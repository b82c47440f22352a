"""The errors that end a run with one line and an exit code, and warnings."""

import errno
import os
import signal
import sys
import tempfile


class Stop(Exception):
  """Ends the run with a one-line message and an exit code."""

  def __init__(self, message, exit_code):
    super().__init__(message)
    self.exit_code = exit_code


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM outside the training loop (which has its own: watch).

  A KeyboardInterrupt, so that code which cleans up after Ctrl-C (the
  download's) does so for SIGTERM too, and no `except Exception` swallows it.
  """


# The signal that came outside the training loop, and where the run was.
_SIGNAL = {"signum": None, "phase": "during start-up"}


def catch_signals():
  """From now on, SIGINT and SIGTERM end the program with one line.

  Called first thing by the entry points. The handler raises Interrupted
  wherever the program is, so that every `finally` and `with` on the way
  up cleans up; the hook below turns whatever then reaches the top (the
  Interrupted, or another exception that a library made of it) into the
  one line, with exit status 128 + the signal. The training loop installs
  its own handler for its time (watch.SignalCatcher), which saves first.
  """
  def handle(signum, _):
    _SIGNAL["signum"] = signum
    raise Interrupted(signal.Signals(signum).name)
  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, handle)
  previous_hook = sys.excepthook

  def hook(kind, value, traceback):
    if _SIGNAL["signum"] is None:
      previous_hook(kind, value, traceback)
      return
    sys.stdout.flush()
    print(interrupted_line(), file=sys.stderr, flush=True)
    os._exit(128 + _SIGNAL["signum"])  # pylint: disable=protected-access
  sys.excepthook = hook


def interrupted_line():
  """The line of a program stopped by the signal that catch_signals saw."""
  return "%s: interrupted by %s %s" % (
      os.path.basename(sys.argv[0]), signal.Signals(_SIGNAL["signum"]).name,
      _SIGNAL["phase"])


def signal_seen():
  """The signal that catch_signals' handler saw, or None."""
  return _SIGNAL["signum"]


def set_signal_phase(phase):
  """Names where the run is, for the line of a later signal."""
  _SIGNAL["phase"] = phase


class UserError(Stop):
  """A problem the user can fix; printed as one error line, no traceback."""

  def __init__(self, message, exit_code=1):
    super().__init__(message, exit_code)


class DataError(UserError, ValueError):
  """The corpus cannot be had or used; the message says what to do about it.

  Raised by reader.py (the files) and ptb/data.py (the download and cache);
  a UserError, so the entry points print it as one error line (exit code 1).
  """


def warn(message):
  """One warning line on stderr, named like the run's error lines."""
  print("%s: warning: %s" % (os.path.basename(sys.argv[0]), message),
        file=sys.stderr, flush=True)


# The operating system's texts for its errors ("No space left on device").
_STRERRORS = sorted({os.strerror(code) for code in errno.errorcode}, key=len,
                    reverse=True)
# The lines of an OpError's message around the op's own error text.
_OP_ERROR_FRAME = ("Graph execution error", "Detected at node", "File ",
                   "Node:", "[[", "Hint:")


def write_failure(error, directory=None):
  """Why a write failed, in the operating system's words where it has them.

  An OSError gives its errno text. TensorFlow's OpError wraps the OS error
  in its message, below a first line that may be only "Graph execution
  error:" (as "path; No space left on device"): the errno text is taken
  from there. Without one, a probe file written in `directory` gives the
  errno of a write there now, if it fails.

  Args:
    error: the exception of the failed write.
    directory: where the write went, for the probe.

  Returns:
    The reason, one line.
  """
  if isinstance(error, OSError) and error.strerror:
    return error.strerror
  text = getattr(error, "message", None) or str(error)
  for strerror in _STRERRORS:  # the longest first: none hides another
    if strerror in text:
      return strerror
  probe_failure = _probe_write(directory) if directory else None
  return probe_failure or op_message(error)


def op_message(error):
  """An error's own text, one line: an OpError's without TensorFlow's frame."""
  text = getattr(error, "message", None) or str(error)
  lines = [l.strip() for l in text.splitlines()
           if l.strip() and not l.strip().startswith(_OP_ERROR_FRAME)]
  return (lines or [type(error).__name__])[0]


def _probe_write(directory):
  """The errno text of a failed write of a file in `directory`, or None."""
  try:
    with tempfile.TemporaryFile(dir=directory) as f:
      f.write(b"\0" * 65536)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    return e.strerror or str(e)
  return None


def print_stop(stop):
  """Prints the Stop `stop` on stderr: the run's one line, named like it."""
  print("%s: %s%s" % (os.path.basename(sys.argv[0]),
                      "error: " if isinstance(stop, UserError) else "", stop),
        file=sys.stderr)


def _parse_flags(argv):
  """Parses the command line as absl does; a bad flag is a UserError.

  absl's own parser prints two lines and exits with status 1; a flag that
  does not parse is a usage error like a flag out of its range: one line,
  status 2.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    raise UserError(" ".join(str(e).split()), exit_code=2) from None


def run_main(main_fn, graph_mode=True):
  """Entry point: runs main_fn under absl; a Stop ends it as one line.

  Args:
    main_fn: the script's main(argv).
    graph_mode: set TensorFlow up for this port's TF1 graphs first
      (compare_curves.py, which only starts other scripts, runs without
      TensorFlow).
  """
  # pylint: disable=g-import-not-at-top
  # Imported here: monitor imports this module, and the entry points import
  # monitor before TensorFlow (monitor.reduce_memory_footprint()).
  from absl import app
  if graph_mode:
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    # Saver's "Restoring parameters" lines and deprecation notices of the
    # TF1 API this port deliberately uses are noise next to its output.
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  try:
    app.run(main_fn, flags_parser=_parse_flags)
  except Stop as e:
    print_stop(e)
    sys.exit(e.exit_code)
