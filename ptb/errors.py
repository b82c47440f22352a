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


def run_main(main_fn):
  """Entry point: graph mode, and a Stop as one line without traceback."""
  # pylint: disable=g-import-not-at-top
  # Imported here: ptb_word_lm imports this module before TensorFlow, which
  # must come after monitor.reduce_memory_footprint().
  from absl import app
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
