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
