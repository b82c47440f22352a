"""What a run writes, checked before any work starts, and the save_path lock.

A run that cannot write one of its outputs should say so in its first
second, not after hours of training; and two runs must never share a
--save_path, where each would move the other's `checkpoint` pointer.
"""

import fcntl
import os
import tempfile

from ptb.errors import UserError

# The locks this process holds, for its whole life.
_HELD = []


def _first_existing(path):
  """`path` or its nearest ancestor that exists."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return path


def _probe(flag, path, directory):
  """Proves that a file can be created in `directory`; leaves nothing."""
  try:
    fd, probe = tempfile.mkstemp(prefix=".write_test.", dir=directory)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise UserError("--%s=%s cannot be written: %s" % (
        flag, path, e.strerror or e)) from None


def check_directory(flag, path, shown=None):
  """Refuses a directory output that cannot be created or written.

  `path` or, if it does not exist yet, its nearest existing ancestor must
  be a writable directory; nothing is created. The message names the flag
  with `shown` (default `path`).
  """
  shown = shown or path
  existing = _first_existing(path)
  if not os.path.isdir(existing):
    raise UserError("--%s=%s cannot be written: Not a directory (%s is a "
                    "file)" % (flag, shown, existing))
  _probe(flag, shown, existing)


def check_file(flag, path):
  """Refuses a file output that is a directory or cannot be written.

  Its parent directory must exist or be creatable (see check_directory);
  an existing file must be writable. Nothing is created.
  """
  if os.path.isdir(path):
    raise UserError("--%s=%s is a directory; give a file name" % (flag, path))
  check_directory(flag, os.path.dirname(os.path.abspath(path)), path)
  if os.path.exists(path) and not os.access(path, os.W_OK):
    raise UserError("--%s=%s cannot be written: permission denied"
                    % (flag, path))


class SavePathLock(object):
  """An advisory lock on a --save_path for the life of this process.

  flock(2) on `save_path/.lock`, which holds the holder's process id. The
  kernel releases it when the process ends, however it ends, so a crashed
  run never blocks the next one.
  """

  NAME = ".lock"

  def __init__(self, save_path):
    self._path = os.path.join(save_path, self.NAME)
    self._fd = None

  def acquire(self):
    """Takes the lock, or raises UserError naming the process that has it."""
    os.makedirs(os.path.dirname(self._path), exist_ok=True)
    fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
      os.close(fd)
      raise UserError(
          "--save_path=%s is in use by another run (process %s); wait for "
          "it to end, or use another --save_path"
          % (os.path.dirname(self._path), holder)) from None
    try:
      os.ftruncate(fd, 0)
      os.write(fd, b"%d\n" % os.getpid())
    except OSError as e:  # a full disk
      os.close(fd)
      raise UserError("--save_path=%s cannot be written: %s"
                      % (os.path.dirname(self._path), e.strerror)) from None
    self._fd = fd
    return self

  def release(self):
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


# The names a run writes in its --save_path (checkpoint.py, tensorboard.py,
# the lock): no other output may take one of them.
_SAVE_PATH_NAMES = (SavePathLock.NAME, "checkpoint")
_SAVE_PATH_PREFIXES = ("model.ckpt", "checkpoint.tmp", "events.out.tfevents")


def _same_file(a, b):
  """Whether paths `a` and `b` name one file (through .., links, hard links)."""
  if os.path.realpath(a) == os.path.realpath(b):
    return True
  try:
    return os.path.samefile(a, b)
  except OSError:  # one of them does not exist yet
    return False


def check_distinct(files, save_path=None, inputs=None):
  """Refuses two outputs that name one file, before any work.

  Args:
    files: {flag: path} of the file outputs that are set.
    save_path: the --save_path directory, or None: no file output may be
      it, or one of the files a run writes in it.
    inputs: (flag, path) pairs of files read; no output may overwrite one.

  Raises:
    UserError: naming both flags.
  """
  named = sorted(files.items())
  for i, (flag, path) in enumerate(named):
    for other, other_path in named[i + 1:] + list(inputs or ()):
      if _same_file(path, other_path):
        raise UserError("--%s=%s and --%s=%s name the same file; give each "
                        "output its own" % (flag, path, other, other_path),
                        exit_code=2)
    if save_path is None:
      continue
    if _same_file(path, save_path):
      raise UserError("--%s=%s is the --save_path directory; give the file "
                      "another name" % (flag, path), exit_code=2)
    name = os.path.basename(path)
    if (_same_file(os.path.dirname(os.path.abspath(path)), save_path)
        and (name in _SAVE_PATH_NAMES or name.startswith(_SAVE_PATH_PREFIXES))):
      raise UserError("--%s=%s is a name the run writes in --save_path=%s; "
                      "give the file another name" % (flag, path, save_path),
                      exit_code=2)


def check_all(save_path, memory_log, summary_json):
  """Checks a run's outputs (the flags; None when unset) before any work."""
  if save_path:
    check_directory("save_path", save_path)
  if memory_log:
    check_file("memory_log", memory_log)
  if summary_json:
    check_file("summary_json", summary_json)
  check_distinct({flag: path for flag, path in (("memory_log", memory_log),
                                                ("summary_json", summary_json))
                  if path}, save_path)


def lock(save_path, chief=True):
  """Locks `save_path` (if given) until this process ends.

  Args:
    save_path: the --save_path flag, or None.
    chief: whether this process saves: in a cluster only the chief does,
      and it alone holds the lock.
  """
  if save_path and chief:
    _HELD.append(SavePathLock(save_path).acquire())
