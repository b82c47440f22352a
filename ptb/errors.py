"""The errors that end a run with one line and an exit code, and warnings."""

import os
import sys


class Stop(Exception):
  """Ends the run with a one-line message and an exit code."""

  def __init__(self, message, exit_code):
    super().__init__(message)
    self.exit_code = exit_code


class UserError(Stop):
  """A problem the user can fix; printed as one error line, no traceback."""

  def __init__(self, message, exit_code=1):
    super().__init__(message, exit_code)


def warn(message):
  """One warning line on stderr, named like the run's error lines."""
  print("%s: warning: %s" % (os.path.basename(sys.argv[0]), message),
        file=sys.stderr, flush=True)


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
    app.run(main_fn)
  except Stop as e:
    print("%s: %s%s" % (os.path.basename(sys.argv[0]),
                        "error: " if isinstance(e, UserError) else "", e),
          file=sys.stderr)
    sys.exit(e.exit_code)
