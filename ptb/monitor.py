"""Process memory instrumentation for training runs.

Standard library only: importing this module loads neither TensorFlow nor
matplotlib, so it can measure a process before either is imported, and set
up the process before TensorFlow is (reduce_memory_footprint), and trim it
once start-up is over (release_library_pages).

  with monitor.MemorySampler("memory.csv") as sampler:
    sampler.set_phase("train", epoch, step)
    ...
  monitor.write_json_atomic("summary.json", {"peak_rss_mib": ...})
"""

import csv
import ctypes
import json
import mmap
import os
import re
import resource
import sys
import tempfile
import threading
import time

from ptb.errors import warn
from ptb.errors import write_failure

_MIB = 1024.0 * 1024.0

# Columns every memory log has; GPU columns follow them.
BASE_COLUMNS = ("seconds", "rss_mib", "phase", "epoch", "step")


def _statm_rss_mib():
  """Returns the RSS from /proc/self/statm in MiB, or None without /proc."""
  try:
    with open("/proc/self/statm", "rb") as f:
      resident_pages = int(f.read().split()[1])
  except (OSError, IndexError, ValueError):
    return None
  return resident_pages * os.sysconf("SC_PAGE_SIZE") / _MIB


def _rusage_peak_mib():
  """Returns getrusage's peak RSS of this process in MiB."""
  maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  # ru_maxrss is in KiB on Linux but in bytes on macOS.
  if sys.platform == "darwin":
    return maxrss / _MIB
  return maxrss / 1024.0


def current_rss_mib():
  """Returns the resident set size of this process now, in MiB.

  Where /proc is missing (not Linux) this falls back to the peak RSS, the
  only figure getrusage offers.
  """
  rss = _statm_rss_mib()
  return _rusage_peak_mib() if rss is None else rss


def peak_rss_mib():
  """Returns the peak resident set size of this process in MiB.

  This is never below current_rss_mib(): the kernel's high-water mark can
  lag the RSS that /proc/self/statm reports by a few pages.
  """
  return max(_rusage_peak_mib(), _statm_rss_mib() or 0.0)


def page_faults():
  """Returns the page faults this process has taken so far (getrusage).

  Minor and major faults together. A page faults when the process first
  touches it, and again after the allocator has given it back to the
  system: a program that keeps its memory takes few per training step, one
  whose malloc unmaps large blocks takes one per page of them, every step.
  """
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_minflt + usage.ru_majflt


def reset_peak_rss():
  """Lowers the peak RSS to the current RSS, so that it measures what follows.

  Linux keeps one high-water mark per process, which getrusage reports;
  writing "5" to /proc/self/clear_refs resets it. Elsewhere nothing
  happens.

  Returns:
    True if the mark was reset.
  """
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
  except OSError:
    return False
  return True


# mallopt's parameter number for the arena limit (glibc's malloc.h).
_M_ARENA_MAX = -8


def reduce_memory_footprint():
  """Process settings that lower the peak RSS; call before importing TensorFlow.

  For entry points only: a program that imports ptb_word_lm as a module
  keeps its Keras and its allocator settings.

  - Importing TensorFlow imports Keras 3 eagerly (and with it matplotlib,
    scipy and h5py): about 70 MiB of RSS and a second of start-up for a
    library this program never uses. TensorFlow carries on when that import
    fails, so this makes `import keras` fail.
  - glibc malloc keeps up to 8 arenas per core, one per thread that
    allocates at the same time as another, and each keeps its own freed
    memory. TensorFlow's threads allocate the many small tensors of an LSTM
    step (larger ones come from its own pool) in several arenas at once, so
    the peak RSS varied from run to run by up to 180 MiB on the large
    model. Two arenas remove most of that at the same speed.
    glibc applies the limit to threads that have not allocated yet, hence
    before TensorFlow starts any. MALLOC_ARENA_MAX in the environment wins.

  Returns:
    True if the arena limit was set here.
  """
  sys.modules.setdefault("keras", None)
  if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
    return False
  try:
    return ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 2) == 1
  except (OSError, AttributeError):  # Not glibc.
    return False


# A shared object: libfoo.so, libfoo.so.2, ext.cpython-311-x86_64-linux-gnu.so.
_SHARED_OBJECT = re.compile(r"\.so(\.[0-9]+)*$")


def _parse_smaps(smaps):
  """Returns one dict per mapping of /proc/<pid>/smaps lines.

  Each dict has "start", "end", "perms", "path" and the mapping's numeric
  fields in kB ("Rss", "Anonymous", ...).
  """
  mappings = []
  for line in smaps:
    fields = line.split(None, 5)
    if not fields:
      continue
    if not fields[0].endswith(":"):  # a mapping's header line
      start, end = (int(x, 16) for x in fields[0].split("-"))
      mappings.append({"start": start, "end": end, "perms": fields[1],
                       "path": fields[5].strip() if len(fields) > 5 else ""})
    elif mappings and len(fields) >= 2 and fields[1].isdigit():
      mappings[-1][fields[0][:-1]] = int(fields[1])
  return mappings


def _releasable_mappings(smaps):
  """Yields (start, length, rss_kib) of each mapping to release.

  Args:
    smaps: an iterable over the lines of /proc/<pid>/smaps.
  """
  for vma in _parse_smaps(smaps):
    if (vma["perms"][1] != "w" and vma["perms"][3] == "p" and
        _SHARED_OBJECT.search(vma["path"]) is not None and
        vma.get("Rss", 0) > 0 and vma.get("Anonymous", 1) == 0 and
        vma.get("Private_Dirty", 1) == 0):
      yield vma["start"], vma["end"] - vma["start"], vma["Rss"]


def release_library_pages():
  """Drops this process's resident pages of shared libraries' code and data.

  Importing TensorFlow runs the registrations of thousands of ops and
  kernels spread over its libraries, and building, optimising and first
  running a graph runs more code once. On the large model this left a
  quarter of the peak RSS in library pages that the training steps never
  touch again. Call this when start-up is over
  and after the first call of a graph; the RSS then shows what training
  holds.

  Only mappings that cannot hold anything this process wrote are touched:
  read-only private mappings of a shared object (`*.so`, `*.so.N`) with no
  page copied on write. madvise(MADV_DONTNEED) unmaps their pages; the
  pages stay in the kernel's page cache, and those used again come back on
  their next touch with a minor fault, without disk I/O. The kernel would
  drop them itself under memory pressure. Shared objects are never unloaded
  while this program runs, so the addresses read from /proc stay theirs.

  Returns:
    The MiB released (the RSS those mappings had); 0 where this is not Linux.
  """
  dontneed = getattr(mmap, "MADV_DONTNEED", None)
  if dontneed is None or not sys.platform.startswith("linux"):
    return 0.0
  try:
    with open("/proc/self/smaps") as f:
      mappings = list(_releasable_mappings(f))
    madvise = ctypes.CDLL(None).madvise
  except (OSError, AttributeError):
    return 0.0
  madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
  released_kib = 0
  for start, length, rss_kib in mappings:
    if madvise(start, length, dontneed) == 0:
      released_kib += rss_kib
  return released_kib / 1024.0


def write_json_atomic(path, obj):
  """Writes `obj` as JSON to `path` so readers never see a partial file.

  The JSON goes to a temporary file in the same directory (os.replace is
  atomic only within one file system), is flushed to disk, then renamed
  over `path`. A process killed at any point leaves either the old file or
  the new one.

  Args:
    path: destination file.
    obj: a JSON-serializable value.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp_path = tempfile.mkstemp(
      dir=directory, prefix="." + os.path.basename(path) + ".",
      suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(obj, f, indent=2, sort_keys=False)
      f.write("\n")
      f.flush()
      os.fsync(f.fileno())
    # mkstemp creates files readable by the owner only; a run summary is no
    # secret and others (plot tools, CI) should be able to read it.
    os.chmod(tmp_path, 0o644)
    os.replace(tmp_path, path)
  except BaseException:
    os.unlink(tmp_path)
    raise


def _column_prefix(gpu_name):
  """Turns a device name such as "GPU:0" into a column prefix "gpu0"."""
  return "".join(c for c in gpu_name.lower() if c.isalnum())


def _log_end(path, columns):
  """Where the memory log at `path` ends, for a resumed run to append to it.

  Cuts off a last line that a killed process left unfinished.

  Returns:
    the seconds of its last row (0.0 for a header alone); None if there is
    no log at `path`, or one of other columns, which is then to be replaced.
  """
  try:
    with open(path, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    return None
  except OSError as e:
    warn("the memory log %s cannot be read (%s); it is replaced"
         % (path, e.strerror or e))
    return None
  whole = data.rfind(b"\n") + 1   # the bytes of its complete lines
  lines = data[:whole].decode("utf-8", "replace").splitlines()
  if not lines or lines[0].split(",") != list(columns):
    if data:
      warn("the memory log %s has other columns than %s; it is replaced"
           % (path, ",".join(columns)))
    return None
  if whole < len(data):
    os.truncate(path, whole)
  for line in reversed(lines[1:]):
    try:
      return float(line.split(",")[0])
    except ValueError:
      continue
  return 0.0


class MemorySampler:
  """Logs this process's RSS to a CSV file from a background thread.

  One row `seconds,rss_mib,phase,epoch,step` is written at start, one every
  `interval` seconds, one whenever the phase or epoch changes, and one at
  stop, each flushed at once so a killed run keeps what it sampled. With
  GPUs, each adds the columns `<gpu>_bytes_in_use,<gpu>_peak_bytes`.

  The clock and the wait between samples can be replaced, so that a test
  decides when the thread samples and what time each row shows instead of
  depending on how fast a loaded machine schedules the thread.
  """

  def __init__(self, path, interval=2.0, gpu_memory_fn=None, gpu_names=(),
               *, append=False, clock=time.monotonic, wait=None):
    """Creates a sampler; nothing is opened until start().

    Args:
      path: CSV file to write (replaced if it exists, unless `append`).
      interval: seconds between samples.
      gpu_memory_fn: called as `gpu_memory_fn(name)` for each GPU name, it
        returns `{"current": bytes, "peak": bytes}` like
        tf.config.experimental.get_memory_info.
      gpu_names: device names to pass to `gpu_memory_fn`, e.g. ("GPU:0",).
      append: continue a log with these columns found at `path` (a resumed
        run's), its rows' seconds going on from its last row's; a log of
        other columns is replaced, with a warning.
      clock: returns the current time in seconds; a row's `seconds` is its
        time minus the time at start() (plus, appending, the last row's).
      wait: called by the sampling thread as `wait(interval)` before each
        sample; it returns True when the thread is to end without sampling.
        The default waits on an event that stop() sets, so stop() ends the
        wait at once. A replacement that never returns True leaves stop()
        waiting for the thread.

    Raises:
      ValueError: if `interval` is not positive, or GPUs are named without a
        `gpu_memory_fn`.
    """
    if interval <= 0:
      raise ValueError("interval must be positive, got %r" % (interval,))
    gpu_names = tuple(gpu_names)
    if gpu_names and gpu_memory_fn is None:
      raise ValueError("gpu_names given without gpu_memory_fn")
    self._path = path
    self._append = append
    self._offset = 0.0   # the seconds of the appended log's last row
    self._interval = float(interval)
    self._gpu_memory_fn = gpu_memory_fn
    self._gpu_names = gpu_names
    # One tuple, replaced whole, so the sampling thread never reads a phase
    # from one step with an epoch or step from another.
    self._position = ("startup", 0, 0)
    # Rows come from the sampling thread and from set_phase; one writer.
    self._lock = threading.Lock()
    self._stop_event = threading.Event()
    self._clock = clock
    self._wait = self._stop_event.wait if wait is None else wait
    self._thread = None
    self._file = None
    self._writer = None
    self._start_time = None
    self._peak_rss_mib = 0.0

  @property
  def columns(self):
    """The CSV header, as a tuple of column names."""
    columns = list(BASE_COLUMNS)
    for name in self._gpu_names:
      prefix = _column_prefix(name)
      columns += [prefix + "_bytes_in_use", prefix + "_peak_bytes"]
    return tuple(columns)

  @property
  def peak_rss_mib(self):
    """The largest RSS sampled so far, in MiB."""
    return self._peak_rss_mib

  def set_phase(self, phase, epoch, step):
    """Records what the program is doing, for the following rows.

    Called on every training step, so within a phase it only assigns an
    attribute: no lock and no I/O. When the phase or epoch changes it also
    writes a row at once: a validation pass can be shorter than `interval`,
    and the log would otherwise not show it at all.

    Args:
      phase: a short name such as "train", "valid" or "test".
      epoch: the current epoch number.
      step: the current step within the phase.
    """
    changed = self._position[:2] != (phase, epoch)
    self._position = (phase, epoch, step)
    if changed and self._file is not None:
      self.sample()

  def start(self):
    """Opens the file, writes the header and a first row, starts sampling.

    Returns:
      self, for chaining.

    Raises:
      RuntimeError: if the sampler was already started.
    """
    if self._file is not None or self._thread is not None:
      raise RuntimeError("MemorySampler already started")
    os.makedirs(os.path.dirname(os.path.abspath(self._path)), exist_ok=True)
    end = _log_end(self._path, self.columns) if self._append else None
    self._file = open(self._path, "w" if end is None else "a", newline="")
    self._writer = csv.writer(self._file)
    if end is None:
      self._writer.writerow(self.columns)
    self._offset = end or 0.0
    self._start_time = self._clock()
    # Written here rather than by the thread, so even a run shorter than
    # one interval has a row from its start.
    self.sample()
    self._thread = threading.Thread(
        target=self._run, name="MemorySampler", daemon=True)
    self._thread.start()
    return self

  def stop(self):
    """Stops sampling, writes a last row and closes the file.

    Safe to call more than once, or without start().
    """
    if self._thread is not None:
      self._stop_event.set()
      self._thread.join()
      self._thread = None
    if self._file is not None:
      self.sample()
      with self._lock:
        self._file.close()
        self._file = None
        self._writer = None

  def __enter__(self):
    return self.start()

  def __exit__(self, exc_type, exc_value, traceback):
    self.stop()
    return False

  def _run(self):
    # By default Event.wait rather than time.sleep, so stop() ends the wait
    # at once.
    while not self._wait(self._interval):
      self.sample()

  def sample(self):
    """Writes one row for the current moment, now.

    The sampling thread calls this once per interval, set_phase on a change
    of phase or epoch, start() and stop() once each. Does nothing before
    start() or after stop().
    """
    with self._lock:
      if self._file is None:  # not started, or stop() closed it meanwhile
        return
      # Timed inside the lock, so the rows' seconds stay in order.
      rss = current_rss_mib()
      self._peak_rss_mib = max(self._peak_rss_mib, rss)
      phase, epoch, step = self._position
      seconds = self._offset + self._clock() - self._start_time
      row = ["%.3f" % seconds, "%.1f" % rss,
             phase, epoch, step]
      for name in self._gpu_names:
        row += self._gpu_row(name)
      try:
        self._writer.writerow(row)
        self._file.flush()
      except OSError as e:
        # The log is worth less than the run: it stops, the training goes on.
        warn("the memory log %s can no longer be written (%s); it keeps "
             "the rows written before and stops there, the training goes on"
             % (self._path, write_failure(e)))
        try:
          self._file.close()
        except OSError:
          pass
        self._file = None

  def _gpu_row(self, name):
    """Returns `[bytes_in_use, peak_bytes]` for one GPU, empty if unknown."""
    try:
      info = self._gpu_memory_fn(name)
      return [int(info["current"]), int(info["peak"])]
    except Exception:  # pylint: disable=broad-except
      # An exception here would end the sampling thread and with it the
      # RSS log; a GPU whose memory cannot be read leaves its cells empty.
      return ["", ""]
