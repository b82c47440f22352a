"""Where the PTB comes from: --data_path, $PTB_DATA_PATH, or a checked cache.

Without --data_path and $PTB_DATA_PATH, the data lives in
`$XDG_CACHE_HOME/ptb_word_lm/simple-examples/data` (`~/.cache/...` when
XDG_CACHE_HOME is unset), filled on first use from Mikolov's archive (or
from $PTB_DATA_URL: a mirror, or a file:// URL). Only the three PTB files
are taken from it, their MD5 sums are checked against the published ones,
and everything is written into a temporary directory inside the cache and
renamed into place only when complete and checked: an interrupted, failed
or concurrent first run never leaves a half-filled cache, and no process
ever reads one. Standard library only.
"""

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib

from ptb.errors import DataError
from ptb.errors import Stop

URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
# The published MD5 sums of the three files.
MD5SUMS = {"ptb.train.txt": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
           "ptb.valid.txt": "aa0affc06ff7c36e977d7cd49e3839bf",
           "ptb.test.txt": "8b80168b89c18661a38ef683c0dc3721"}
# The corpus's three files, in the order train, valid, test.
FILE_NAMES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")
# Seconds without a byte from the server before the download gives up.
_TIMEOUT = 60
_CHUNK = 1 << 20


def cache_root():
  """`$XDG_CACHE_HOME/ptb_word_lm`, or `~/.cache/ptb_word_lm`.

  The project's cache: the data here, the built kernels (ptb/kernels.py)
  unless $PTB_KERNEL_DIR says otherwise.
  """
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "ptb_word_lm")


def cached_data_dir():
  """The cache's data directory (it exists only once it is complete)."""
  return os.path.join(cache_root(), "simple-examples", "data")


def local_data_dir():
  """The PTB without --data_path and without the network, or None.

  $PTB_DATA_PATH if set, else the cache directory if it is filled: where a
  run would look before it downloads (tests use this).
  """
  if os.environ.get("PTB_DATA_PATH"):
    return os.environ["PTB_DATA_PATH"]
  return cached_data_dir() if os.path.isdir(cached_data_dir()) else None


def _say(message):
  print(message, file=sys.stderr, flush=True)


def resolve(data_path, say=_say):
  """The directory of the three PTB files for a run.

  Args:
    data_path: --data_path, or None.
    say: takes the one line that says where the data comes from.

  Returns:
    `data_path` when given; else $PTB_DATA_PATH when set; else the cache
    directory, downloaded and checked first if it is not there yet.

  Raises:
    DataError: the download or its check failed, or the cache cannot be
      written; nothing is left in the cache.
    Stop: Ctrl-C during the download (exit status 130); nothing is left.
  """
  if data_path:
    return data_path
  if os.environ.get("PTB_DATA_PATH"):
    say("PTB data from $PTB_DATA_PATH: %s" % os.environ["PTB_DATA_PATH"])
    return os.environ["PTB_DATA_PATH"]
  target = cached_data_dir()
  if os.path.isdir(target):
    say("PTB data from the cache: %s" % target)
    return target
  url = os.environ.get("PTB_DATA_URL") or URL
  try:
    download(url, cache_root(), say)
  except KeyboardInterrupt:
    raise Stop("interrupted during the download of %s; nothing was kept in "
               "the cache" % url, 130) from None
  say("PTB data downloaded from %s and checked: %s" % (url, target))
  return target


def corpus_files(data_path):
  """The paths of the three files in `data_path`, which must hold them.

  Here rather than in reader.py, which needs TensorFlow: compare_curves.py
  checks its --data_path with it before it starts anything.

  Raises:
    DataError: `data_path` is not a directory, or a file is missing.
  """
  if not os.path.isdir(data_path):
    what = "is a file" if os.path.exists(data_path) else "does not exist"
    raise DataError(
        "--data_path=%s %s: give the directory that holds %s (for example "
        "simple-examples/data from %s)"
        % (data_path, what, ", ".join(FILE_NAMES), URL))
  paths = [os.path.join(data_path, name) for name in FILE_NAMES]
  for path in paths:
    if not os.path.exists(path):
      raise DataError(
          "%s is missing: --data_path must hold %s; get them by unpacking %s "
          "and pointing --data_path at simple-examples/data"
          % (path, ", ".join(FILE_NAMES), URL))
  return paths


def _by_hand(url):
  return ("download it by hand (curl -O %s; tar xzf %s) and pass "
          "--data_path=simple-examples/data" % (url, url.rsplit("/", 1)[-1]))


def download(url, root, say=_say):
  """Fills `root`/simple-examples/data from the archive at `url`.

  Raises:
    DataError: see resolve().
  """
  try:
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".download-", dir=root)
  except OSError as e:
    raise DataError(
        "the cache directory %s cannot be written (%s); set XDG_CACHE_HOME "
        "to a writable directory, or %s" % (root, e.strerror or e,
                                            _by_hand(url))) from None
  try:
    archive = os.path.join(tmp, "simple-examples.tgz")
    _fetch(url, archive, say)
    data = os.path.join(tmp, "simple-examples", "data")
    _extract(url, archive, data)
    _check(url, data)
    try:
      os.rename(os.path.join(tmp, "simple-examples"),
                os.path.join(root, "simple-examples"))
    except OSError:
      # Another process renamed its complete copy into place first.
      if not os.path.isdir(os.path.join(root, "simple-examples", "data")):
        raise DataError("%s is in the way of the downloaded data; remove it"
                        % os.path.join(root, "simple-examples")) from None
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _fetch(url, path, say):
  """Downloads `url` to `path`, with progress on stderr.

  The transfer runs in a thread of its own while the main thread waits in
  short slices. A signal (Ctrl-C) goes to any thread of the process,
  TensorFlow's included, and Python raises it in the main thread only when
  that thread next runs: blocked in the socket's read, it would wait out
  the server's silence (up to the 60 s timeout) before stopping.
  """
  outcome = {}

  def transfer():
    try:
      _transfer(url, path, say)
    except BaseException as e:  # pylint: disable=broad-except
      outcome["error"] = e

  worker = threading.Thread(target=transfer, name="ptb-download",
                            daemon=True)
  worker.start()
  while worker.is_alive():
    worker.join(0.1)
  if "error" in outcome:
    raise outcome["error"]


def _transfer(url, path, say):
  """_fetch's work: the request and the copy to `path`."""
  try:
    with urllib.request.urlopen(url, timeout=_TIMEOUT) as response, \
        open(path, "wb") as out:
      total = int(response.headers.get("Content-Length") or 0) or None
      progress = _Progress(url, total, say)
      done = 0
      while True:
        chunk = response.read(_CHUNK)
        if not chunk:
          break
        out.write(chunk)
        done += len(chunk)
        progress.update(done)
      progress.finish(done)
  except urllib.error.HTTPError as e:
    raise DataError("cannot download %s: HTTP %d %s; %s"
                    % (url, e.code, e.reason, _by_hand(url))) from None
  except (urllib.error.URLError, OSError, ValueError) as e:
    reason = getattr(e, "reason", None) or e
    raise DataError("cannot download %s: %s; %s"
                    % (url, reason, _by_hand(url))) from None
  if total is not None and done < total:
    raise DataError("the download of %s stopped after %d of %d bytes; run "
                    "again, or %s" % (url, done, total, _by_hand(url)))


class _Progress(object):
  """Bytes, total and rate on stderr: one line redrawn on a terminal, else
  a line at the start and at every quarter."""

  def __init__(self, url, total, say):
    self._total, self._say = total, say
    self._start = self._last = time.time()
    self._tty = sys.stderr.isatty()
    self._quarter = 0
    say("Downloading %s%s" % (url, " (%.1f MB)" % (total / 1e6)
                              if total else ""))

  def _line(self, done):
    rate = done / max(time.time() - self._start, 1e-6) / 1e6
    if self._total:
      return "  %.1f of %.1f MB (%.0f %%), %.1f MB/s" % (
          done / 1e6, self._total / 1e6, 100.0 * done / self._total, rate)
    return "  %.1f MB, %.1f MB/s" % (done / 1e6, rate)

  def update(self, done):
    if self._tty:
      if time.time() - self._last >= 0.2:
        self._last = time.time()
        sys.stderr.write("\r" + self._line(done))
        sys.stderr.flush()
    elif self._total and done * 4 // self._total > self._quarter:
      self._quarter = done * 4 // self._total
      self._say(self._line(done))

  def finish(self, done):
    if self._tty:
      sys.stderr.write("\r" + self._line(done) + "\n")
      sys.stderr.flush()


def _extract(url, archive, data):
  """Writes the archive's three PTB files into `data`; refuses unsafe paths."""
  os.makedirs(data)
  try:
    with tarfile.open(archive, "r:gz") as tar:
      for member in tar:
        parts = member.name.split("/")
        if member.name.startswith("/") or ".." in parts:
          raise DataError("%s holds a member with an unsafe path (%s); "
                          "nothing was kept" % (url, member.name))
        if (member.isfile() and parts[-1] in MD5SUMS and len(parts) > 1 and
            parts[-2] == "data"):
          with tar.extractfile(member) as src, open(
              os.path.join(data, parts[-1]), "wb") as dst:
            shutil.copyfileobj(src, dst)
  except (tarfile.TarError, EOFError, zlib.error) as e:
    raise DataError("%s is not a complete .tgz archive (%s); %s"
                    % (url, e, _by_hand(url))) from None
  missing = [n for n in MD5SUMS if not os.path.exists(os.path.join(data, n))]
  if missing:
    raise DataError("%s holds no data/%s; is it the PTB's simple-examples.tgz?"
                    % (url, ", data/".join(missing)))


def file_md5(path):
  digest = hashlib.md5()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(_CHUNK), b""):
      digest.update(block)
  return digest.hexdigest()


def _check(url, data):
  for name, want in MD5SUMS.items():
    got = file_md5(os.path.join(data, name))
    if got != want:
      raise DataError("%s from %s has MD5 %s, not the published %s; nothing "
                      "was kept" % (name, url, got, want))
