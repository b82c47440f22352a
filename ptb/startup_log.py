"""TensorFlow's C++ start-up lines, held to TF_CPP_MIN_LOG_LEVEL.

Importing TensorFlow 2.21 writes its C++ log lines straight to stderr:
"WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR", the oneDNN notice and "Could not find cuda drivers on
your machine". They come through absl's C++ logging before it is set up,
which ignores TF_CPP_MIN_LOG_LEVEL, and they come twice: the CUDA stub and
absl's logging are linked into libtensorflow_framework.so.2 and again into
the profiler plugin (_pywrap_profiler_plugin.so), and each copy logs once.

import_tensorflow() imports TensorFlow with the file descriptor of stderr
sent to a temporary file, then writes back every line but the log lines
below TF_CPP_MIN_LOG_LEVEL (and the absl notice about them), a level it
sets to 3 unless the environment sets it: TF_CPP_MIN_LOG_LEVEL=0 shows
every line again.
"""

import os
import re
import sys
import tempfile

# A C++ log line: severity letter (Info, Warning, Error, Fatal), the date
# (0000 before absl's logging is set up) and time, the thread, the source.
_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
_SEVERITY = {"I": 0, "W": 1, "E": 2, "F": 3}
_ABSL_NOTICE = ("WARNING: All log messages before absl::InitializeLog() is "
                "called are written to STDERR")


def min_log_level():
  """TF_CPP_MIN_LOG_LEVEL as a number (0 when unset or not a number)."""
  try:
    return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
  except ValueError:
    return 0


def kept_lines(text, level):
  """The lines of `text` that TF_CPP_MIN_LOG_LEVEL=`level` lets through.

  Log lines of a severity below `level` go, and so does absl's notice once
  anything goes; every other line stays, in its order.
  """
  lines = text.splitlines(keepends=True)
  kept = []
  for line in lines:
    match = _LOG_LINE.match(line)
    if match and _SEVERITY[match.group(1)] < level:
      continue
    if level > 0 and line.strip() == _ABSL_NOTICE:
      continue
    kept.append(line)
  return kept


def import_tensorflow():
  """Imports TensorFlow, keeping only the start-up lines the level allows.

  Returns:
    The tensorflow module.
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode("utf-8", "replace")
      sys.stderr.write("".join(kept_lines(text, min_log_level())))
      sys.stderr.flush()
  return tf
