"""The --summary_json file: its fields, its rewrites, its continuation.

A run resumed with the same command writes the same summary file. The
resumed process carries the finished epochs of the file it finds there, with
the earlier processes' wall time and peak memory, so that the file always
describes the whole run (docs/running.md, "Summary").
"""

import json
import os
import platform
import time

import tensorflow as tf

from ptb import config as config_lib
from ptb import monitor
from ptb import onednn
from ptb.errors import warn
from ptb.errors import write_failure


# The status that a resume gives an earlier summary left at "running": its
# process ended without recording how (killed, or its last write failed).
STALE_STATUS = "interrupted"


class Summary(object):
  """The summary of one run, rewritten after each save, epoch and at the end.

  Attributes:
    fields: the JSON object written (a dict, in the order documented).
  """

  def __init__(self, path, argv, model, config, devices, start_time=None,
               train_from_zero_state=False, clock=time.time, plan=None):
    """The fields known before training starts.

    Args:
      path: the --summary_json file, or None for no file.
      argv: the command line.
      model: the --model name.
      config: the config used (after overrides).
      devices: the tower devices.
      start_time: the clock's time when this process started (default: now).
      train_from_zero_state: the --train_from_zero_state of the run.
      clock: returns the time in seconds; replaced by tests.
      plan: the run's plan as plan.record gives it, or None.
    """
    self.path = path
    self._clock = clock
    self._start_time = clock() if start_time is None else start_time
    self.fields = {
        "command": list(argv), "model": model,
        "rnn_mode": config.rnn_mode.upper(),
        "config": config_lib.config_fields(config),
        "train_from_zero_state": train_from_zero_state,
        "tensorflow_version": tf.__version__,
        "matmul": onednn.matmul_library(), "plan": plan,
        "python_version": platform.python_version(),
        "devices": list(devices), "epochs": [], "test_perplexity": None,
        "resumes": [], "status": "running", "wall_seconds": 0.0,
        "peak_rss_mib": 0.0}

  def add_epoch(self, record):
    """Appends one finished epoch's record (a dict with its "epoch")."""
    self.fields["epochs"].append(record)

  def resume(self, epochs_done, step, config_changes=None):
    """Carries the run's earlier summary into this one, on resume.

    Keeps the earlier file's records of epochs 1 to `epochs_done`, its
    resumes, its wall time and its peak RSS, and records this resume. A
    file that cannot be read, or is of another model, is replaced, with a
    warning. A file left at status "running" is rewritten at once with
    STALE_STATUS: no process runs on it now.

    Args:
      epochs_done: epochs the restored checkpoint has finished.
      step: training steps it has done in the epoch after them.
      config_changes: {field: {"from": value, "to": value}} from the
        checkpoint's config to this run's; None where it records none.
    """
    this = {"epoch": epochs_done + 1, "step": step, "wall_seconds": 0.0,
            "config_changes": config_changes}
    self.fields["resumes"] = [this]
    earlier = self._read_earlier()
    if earlier is None:
      return
    if earlier.get("status") == "running":
      earlier["status"] = STALE_STATUS
      self._write(earlier)
    epochs = [e for e in earlier.get("epochs") or ()
              if isinstance(e, dict) and 0 < _number(e.get("epoch"))
              <= epochs_done]
    if [e["epoch"] for e in epochs] != list(range(1, epochs_done + 1)):
      warn("the summary %s holds %d of the %d epochs finished before this "
           "resume; the others stay missing from it"
           % (self.path, len(epochs), epochs_done))
    self.fields["epochs"] = epochs
    this["wall_seconds"] = _number(earlier.get("wall_seconds"))
    self.fields["resumes"] = [
        r for r in earlier.get("resumes") or () if isinstance(r, dict)] + [this]
    self.fields["peak_rss_mib"] = _number(earlier.get("peak_rss_mib"))

  def _read_earlier(self):
    """The summary already at `path`, if it is one of this run's model."""
    if not self.path or not os.path.exists(self.path):
      return None
    try:
      with open(self.path) as f:
        earlier = json.load(f)
    except (OSError, ValueError) as e:
      warn("the summary %s cannot be read (%s); this process writes a new "
           "one, without the epochs before the resume"
           % (self.path, getattr(e, "strerror", None) or e))
      return None
    model = earlier.get("model") if isinstance(earlier, dict) else None
    if model != self.fields["model"]:
      warn("the summary %s is not of a %s run (it has model %r); this "
           "process replaces it" % (self.path, self.fields["model"], model))
      return None
    return earlier

  def publish(self, status):
    """Rewrites the file (atomically) with `status`; a no-op without path.

    `wall_seconds` and `peak_rss_mib` cover the whole run: this process and,
    after a resume, the earlier ones up to their last rewrite.
    """
    if not self.path:
      return
    resumes = self.fields["resumes"]
    earlier_seconds = resumes[-1]["wall_seconds"] if resumes else 0.0
    self.fields["status"] = status
    self.fields["wall_seconds"] = (earlier_seconds + self._clock() -
                                   self._start_time)
    # The largest of the earlier processes' peak and this one's.
    self.fields["peak_rss_mib"] = max(self.fields["peak_rss_mib"],
                                      monitor.peak_rss_mib())
    self._write(self.fields, status)

  def _write(self, fields, status="running"):
    """Writes `fields` atomically; a failure costs a warning."""
    try:
      monitor.write_json_atomic(self.path, fields)
    except OSError as e:
      # A summary is worth less than the run: it is written again next time.
      # The write is atomic: a failed one leaves the file as it was.
      if status == "running":
        warn("the summary %s could not be written (%s); the file keeps its "
             "last complete version, and the next epoch or checkpoint "
             "writes it again" % (self.path, write_failure(e)))
      else:
        warn("the summary %s could not be finished (%s): it keeps its last "
             "complete version, whose status is still running; the next "
             "run on this --save_path records it as %s"
             % (self.path, write_failure(e), STALE_STATUS))


def _number(value):
  """`value` if it is a number (not a bool), else 0."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  return value if ok else 0
