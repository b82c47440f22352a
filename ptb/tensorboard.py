"""The TensorBoard scalars of a run, written by the thread that adds them.

tf.compat.v1.summary.FileWriter writes from a thread of its own: a write
that fails there (a full disk) prints that thread's traceback and raises
again in some later call. ScalarWriter writes each epoch's scalars at once
(tf.io.TFRecordWriter, the events file's format), so that a failed write
is seen where it happens: the scalars stop with a warning, and the
training goes on.
"""

import os
import socket
import time

import tensorflow as tf

from ptb.errors import warn
from ptb.errors import write_failure


class ScalarWriter(object):
  """An events file of scalars in a directory, as TensorBoard reads them."""

  def __init__(self, directory):
    """Creates the events file in `directory` (a warning if it cannot)."""
    # The process id keeps two runs of one second apart.
    self.path = os.path.join(directory, "events.out.tfevents.%010d.%s.%d" % (
        time.time(), socket.gethostname(), os.getpid()))
    self._writer = None
    self._failed = False
    self._write(tf.compat.v1.Event(file_version="brain.Event:2"))

  def add(self, step, values):
    """Writes the scalars {tag: value} of global step `step`."""
    self._write(tf.compat.v1.Event(step=step, summary=tf.compat.v1.Summary(
        value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=float(v))
               for tag, v in values.items()])))

  def _write(self, event):
    """Writes `event` to disk now."""
    event.wall_time = time.time()

    def write():
      if self._writer is None:
        self._writer = tf.io.TFRecordWriter(self.path)
      self._writer.write(event.SerializeToString())
      self._writer.flush()
    self._guarded(write)

  def close(self):
    if self._writer is not None:
      self._guarded(self._writer.close)

  def _guarded(self, action):
    """Runs `action`, a write; after one failed, none, and a warning once."""
    if self._failed:
      return
    try:
      action()
    except (tf.errors.OpError, OSError) as e:
      self._failed = True
      warn("the TensorBoard scalars %s can no longer be written (%s); the "
           "file keeps the epochs written before, and the training goes on"
           % (self.path, write_failure(e, os.path.dirname(self.path))))
