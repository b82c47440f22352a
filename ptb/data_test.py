"""Tests of ptb/data.py: the PTB found, downloaded, checked and cached.

Archives are built here and served by a local HTTP server on 127.0.0.1;
never the network. The download, its checks and the cache are tested in
this process: data.resolve with the environment a run would have. Only
Ctrl-C, which is about the process (its exit status, what it leaves on
disk when it stops), runs ptb_word_lm.py.
"""

import contextlib
import ctypes
import hashlib
import http.server
import io
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from unittest import mock

import tensorflow as tf

from ptb import data as data_lib
from ptb import testing
from ptb.errors import DataError

# Generated stand-ins for the three files: fine as a corpus, wrong as PTB,
# random enough that their archive is tens of KB.
_RNG = random.Random(0)
FAKE = {name: "".join(" w%d" % _RNG.randrange(1000) + ("\n" if i % 20 == 19
                                                         else "")
                      for i in range(5000)).encode()
        for name in data_lib.MD5SUMS}
FAKE_SUMS = {name: hashlib.md5(body).hexdigest() for name, body in FAKE.items()}


def make_archive(files, prefix="./simple-examples/data/"):
  """A .tgz (bytes) holding `files` ({name: bytes}) under `prefix`."""
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
    for name, content in files.items():
      info = tarfile.TarInfo(prefix + name)
      info.size = len(content)
      tar.addfile(info, io.BytesIO(content))
  return buffer.getvalue()


class Server(object):
  """Serves {path: bytes} on 127.0.0.1; 404 for anything else.

  `cut_at`: send the full Content-Length but only this many bytes, then
  close (an interrupted download). `stall`: after the first 64 KiB, wait
  up to this many seconds before the rest (a server gone silent); the wait
  ends early when the server is closed, so that no handler outlives the
  test that needed it. `together`: answer no request before this many
  have come (downloads that overlap for sure); 30 s at most.
  """

  def __init__(self, files, cut_at=None, stall=0.0, together=1):
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        outer.requests.append(self.path)
        outer.together.wait(30)
        body = outer.files.get(self.path)
        if body is None:
          self.send_error(404, "Not Found")
          return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = body if cut_at is None else body[:cut_at]
        try:
          self.wfile.write(sent[:65536])
          self.wfile.flush()
          outer.closed.wait(stall)
          self.wfile.write(sent[65536:])
        except (BrokenPipeError, ConnectionResetError):
          pass  # The client gave up (its timeout, Ctrl-C): as it should.

      def log_message(self, *_):
        pass

    self.files = files
    self.requests = []
    self.together = threading.Barrier(together)
    self.closed = threading.Event()
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.httpd.daemon_threads = True
    self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

  def __enter__(self):
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
    return self

  def __exit__(self, *_):
    self.closed.set()
    self.httpd.shutdown()
    self.httpd.server_close()


def dead_url():
  """A URL on 127.0.0.1 where nothing listens."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return "http://127.0.0.1:%d/simple-examples.tgz" % port


def entries_under(directory):
  """Every file and directory under `directory`, relative; [] if none."""
  found = []
  for parent, dirs, files in os.walk(directory):
    found += [os.path.relpath(os.path.join(parent, n), directory)
              for n in dirs + files]
  return sorted(found)


def run_env(cache, url):
  """The environment of a run without --data_path nor $PTB_DATA_PATH."""
  env = dict(os.environ, XDG_CACHE_HOME=cache, PTB_DATA_URL=url)
  env.pop("PTB_DATA_PATH", None)
  return env


class DownloadTest(tf.test.TestCase):
  """data.resolve of a run without --data_path nor $PTB_DATA_PATH."""

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.tmp = tmp.name
    self.cache = os.path.join(tmp.name, "cache")
    self.root = os.path.join(self.cache, "ptb_word_lm")  # data.cache_root()

  def resolve(self, url, cache=None):
    """data.resolve(None) with the archive at `url`, the cache in `cache`.

    Returns:
      (the directory it returned, what it wrote on stderr).
    """
    err = io.StringIO()
    with mock.patch.dict(os.environ, run_env(cache or self.cache, url),
                         clear=True), contextlib.redirect_stderr(err):
      return data_lib.resolve(None), err.getvalue()

  def assertFailsAndLeavesNothing(self, url, pattern):
    """resolve(url) raises DataError(`pattern`) and leaves the cache empty."""
    with self.assertRaisesRegex(DataError, pattern):
      self.resolve(url)
    self.assertEqual(entries_under(self.root), [])

  def testArchiveOfThePtbFillsTheCacheAndLaterRunsNeedNoServer(self):
    # The real files, so that the published MD5 sums are checked as well.
    source = data_lib.local_data_dir()
    if source is None:
      self.skipTest("no real PTB here: set PTB_DATA_PATH")
    real = {}
    for name in data_lib.MD5SUMS:
      with open(os.path.join(source, name), "rb") as f:
        real[name] = f.read()
    # The real archive holds more than the three files: only they are kept.
    archive = make_archive(dict(real, README=b"x"))
    target = os.path.join(self.root, "simple-examples", "data")
    with Server({"/simple-examples.tgz": archive}) as server:
      url = server.url + "/simple-examples.tgz"
      got, err = self.resolve(url)
    self.assertEqual(got, target)
    self.assertEqual(server.requests, ["/simple-examples.tgz"])
    lines = err.splitlines()
    self.assertEqual(lines[0], "Downloading %s (%.1f MB)"
                     % (url, len(archive) / 1e6))
    # Progress as a line at every quarter off a terminal, up to the total.
    for line in lines[1:-1]:
      self.assertRegex(line, r"^  [\d.]+ of %.1f MB \(\d+ %%\), [\d.]+ MB/s$"
                       % (len(archive) / 1e6))
    self.assertIn("(100 %)", lines[-2])
    self.assertEqual(lines[-1], "PTB data downloaded from %s and checked: %s"
                     % (url, target))
    # Only the three files, as published; no temporary directory left.
    self.assertEqual(entries_under(self.root), sorted(
        ["simple-examples", os.path.join("simple-examples", "data")] +
        [os.path.join("simple-examples", "data", n) for n in real]))
    for name, want in data_lib.MD5SUMS.items():
      self.assertEqual(data_lib.file_md5(os.path.join(target, name)), want)
    # The server is gone: the cache serves the next run, with one line.
    got, err = self.resolve(dead_url())
    self.assertEqual(got, target)
    self.assertEqual(err, "PTB data from the cache: %s\n" % target)

  def testHttpError(self):
    with Server({}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/simple-examples.tgz",
          r"^cannot download http://127\.0\.0\.1:\d+/simple-examples\.tgz: "
          r"HTTP 404 Not Found; download it by hand \(curl -O .*/simple-"
          r"examples\.tgz; tar xzf simple-examples\.tgz\) and pass "
          r"--data_path=simple-examples/data$")

  def testDeadServer(self):
    self.assertFailsAndLeavesNothing(
        dead_url(), r"^cannot download http://127\.0\.0\.1:\d+/simple-"
        r"examples\.tgz: .*refused.*; download it by hand")

  def testServerThatFallsSilentTimesOut(self):
    # The timeout cut short, and the server silent for far longer: the
    # download gives up after the timeout, not when the server goes on.
    big = make_archive({"README": os.urandom(200000)})
    with Server({"/a.tgz": big}, stall=60) as server, mock.patch.object(
        data_lib, "_TIMEOUT", 2):
      start = time.time()
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz", r"^cannot download .*/a\.tgz: timed out; "
          r"download it by hand")
      self.assertLess(time.time() - start, 30)

  def testTruncatedArchive(self):
    archive = make_archive(FAKE)
    half = archive[:len(archive) // 2]
    with Server({"/a.tgz": half}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz", r"a\.tgz is not a complete \.tgz archive "
          r"\(.*\); download it by hand")

  def testInterruptedDownload(self):
    archive = make_archive(FAKE)
    with Server({"/a.tgz": archive}, cut_at=len(archive) // 2) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz",
          r"^the download of .*a\.tgz stopped after %d of %d bytes; run "
          r"again, or download it by hand" % (len(archive) // 2,
                                              len(archive)))

  def testFileWhoseSumDiffers(self):
    with Server({"/a.tgz": make_archive(FAKE)}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz",
          r"^ptb\.train\.txt from .*a\.tgz has MD5 %s, not the published "
          r"%s; nothing was kept$" % (FAKE_SUMS["ptb.train.txt"],
                                      data_lib.MD5SUMS["ptb.train.txt"]))

  def testOneFileWhoseSumDiffers(self):
    # Two files right, the third not: each file is checked, not the first.
    wrong = dict(FAKE, **{"ptb.test.txt": b"x"})
    with Server({"/a.tgz": make_archive(wrong)}) as server, \
        mock.patch.dict(data_lib.MD5SUMS, FAKE_SUMS):
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz", r"^ptb\.test\.txt from .*a\.tgz has MD5 %s"
          % hashlib.md5(b"x").hexdigest())

  def testMemberWithAnUnsafePath(self):
    for name in ("../x", "/etc/x"):
      archive = make_archive(dict(FAKE, **{name: b"x"}), prefix="")
      with Server({"/a.tgz": archive}) as server:
        self.assertFailsAndLeavesNothing(
            server.url + "/a.tgz",
            r"a\.tgz holds a member with an unsafe path \(%s\)" % name)
      self.assertFalse(os.path.exists(os.path.join(self.cache, "x")))

  def testArchiveWithoutThePtbFiles(self):
    with Server({"/a.tgz": make_archive({"README": b"x"})}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz",
          r"a\.tgz holds no data/ptb\.train\.txt, data/ptb\.valid\.txt, "
          r"data/ptb\.test\.txt; is it the PTB's simple-examples\.tgz\?$")

  def testCacheThatCannotBeWritten(self):
    blocker = os.path.join(self.tmp, "a_file")
    with open(blocker, "w") as f:
      f.write("x")
    url = dead_url()
    with self.assertRaisesRegex(
        DataError, r"^the cache directory .*a_file/ptb_word_lm cannot be "
        r"written \(.*\); set XDG_CACHE_HOME to a writable directory, or "
        r"download it by hand"):
      self.resolve(url, cache=blocker)


class CtrlCTest(tf.test.TestCase):
  """Ctrl-C on ptb_word_lm.py while its download waits on a silent server.

  Both tests' processes start together (their TensorFlow start-ups
  overlap) and wait in their download until their test signals them. The
  second waits while the first test runs, a few seconds, far within the
  60 s without a byte after which its download would give up.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._tmp = tempfile.TemporaryDirectory()
    big = make_archive({"README": os.urandom(200000)})
    # The stall lasts until the class is done: a download that the signal
    # did not stop would not end before the test's bound.
    cls._server = Server({"/a.tgz": big}, stall=600).__enter__()
    cls._procs = {}
    # A suite started in the background by a shell (`cmd &`) ignores
    # SIGINT, and a child inherits an ignored signal (it would never stop):
    # with a handler here while they start, the children get the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
      for name in ("main", "other"):
        cache = os.path.join(cls._tmp.name, name)
        cls._procs[name] = (cache, subprocess.Popen(
            [sys.executable, testing.SCRIPT, "--model=test", "--num_gpus=0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=testing.HERE, env=run_env(cache, cls._server.url + "/a.tgz")))
    finally:
      signal.signal(signal.SIGINT, previous)

  @classmethod
  def tearDownClass(cls):
    for _, proc in cls._procs.values():
      if proc.poll() is None:
        proc.kill()
      proc.communicate()
    cls._server.__exit__()
    cls._tmp.cleanup()
    super().tearDownClass()

  def _interrupt(self, name, send):
    """Waits for the process `name` to download, then send(pid).

    Returns:
      (the exit status, stderr, seconds from the signal to the exit, the
      cache directory of the process).
    """
    cache, proc = self._procs[name]
    lines = []
    for line in proc.stderr:
      lines.append(line)
      if line.startswith("Downloading"):
        break
    self.assertTrue(lines and lines[-1].startswith("Downloading"),
                    "".join(lines))
    time.sleep(0.5)  # into the read of the stalled body
    start = time.time()
    send(proc.pid)
    try:
      _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
      self.fail("still downloading 30 s after Ctrl-C: %s" % "".join(lines))
    return proc.returncode, "".join(lines) + err, time.time() - start, cache

  def testCtrlCDuringTheDownloadLeavesNothing(self):
    returncode, err, _, cache = self._interrupt(
        "main", lambda pid: os.kill(pid, signal.SIGINT))
    self._assert_stopped(returncode, err, cache)

  def testCtrlCTakenByAnotherThreadStopsTheDownloadAtOnce(self):
    # The kernel hands a process's signal to any of its threads. Sent to one
    # that is not the main thread (TensorFlow's, or the transfer's), it must
    # still stop the download at once, not when the server's stall ends.
    tgkill = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)
    if tgkill is None or not os.path.isdir("/proc/self/task"):
      self.skipTest("needs Linux's tgkill on x86_64 or aarch64")
    libc = ctypes.CDLL(None, use_errno=True)

    def to_another_thread(pid):
      tid = max(int(t) for t in os.listdir("/proc/%d/task" % pid))
      self.assertNotEqual(tid, pid)
      self.assertEqual(libc.syscall(tgkill, pid, tid, signal.SIGINT), 0)

    returncode, err, seconds, cache = self._interrupt("other",
                                                      to_another_thread)
    self._assert_stopped(returncode, err, cache)
    self.assertLess(seconds, 30)

  def _assert_stopped(self, returncode, err, cache):
    """The exit of a download stopped by Ctrl-C: 130, a line, no cache."""
    self.assertEqual(returncode, 130, err)
    self.assertNotIn("Traceback", err)
    self.assertRegex(err, r"ptb_word_lm\.py: interrupted during the download "
                     r"of .*a\.tgz; nothing was kept in the cache")
    self.assertEqual(entries_under(os.path.join(cache, "ptb_word_lm")), [])


class ResolveTest(tf.test.TestCase):

  def testOrderOfPlaces(self):
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(
        os.environ, {"XDG_CACHE_HOME": tmp, "PTB_DATA_PATH": "/env"}):
      said = []
      self.assertEqual(data_lib.resolve("/flag", said.append), "/flag")
      self.assertEqual(said, [])
      self.assertEqual(data_lib.resolve(None, said.append), "/env")
      self.assertEqual(said, ["PTB data from $PTB_DATA_PATH: /env"])
      del os.environ["PTB_DATA_PATH"]
      self.assertIsNone(data_lib.local_data_dir())
      os.makedirs(os.path.join(tmp, "ptb_word_lm", "simple-examples", "data"))
      self.assertEqual(data_lib.local_data_dir(), data_lib.cached_data_dir())
      self.assertTrue(data_lib.cached_data_dir().startswith(tmp))

  def testConcurrentFirstRunsShareOneCompleteCache(self):
    archive = make_archive(FAKE)
    with tempfile.TemporaryDirectory() as tmp, Server(
        {"/a.tgz": archive}, together=2) as server, mock.patch.dict(
            os.environ, {"XDG_CACHE_HOME": tmp,
                         "PTB_DATA_URL": server.url + "/a.tgz"}), \
        mock.patch.dict(data_lib.MD5SUMS, FAKE_SUMS):
      os.environ.pop("PTB_DATA_PATH", None)
      results, errors = [], []

      def first_run():
        try:
          results.append(data_lib.resolve(None, lambda _: None))
        except Exception as e:  # pylint: disable=broad-except
          errors.append(e)

      threads = [threading.Thread(target=first_run) for _ in range(2)]
      for t in threads:
        t.start()
      for t in threads:
        t.join(60)
      self.assertEqual(errors, [])
      # Both downloaded at once: the second to finish found the first's in
      # place.
      self.assertEqual(server.requests, ["/a.tgz"] * 2)
      self.assertEqual(results, [data_lib.cached_data_dir()] * 2)
      data = os.path.join("simple-examples", "data")
      self.assertEqual(entries_under(os.path.join(tmp, "ptb_word_lm")),
                       sorted(["simple-examples", data] +
                              [os.path.join(data, n) for n in FAKE]))


if __name__ == "__main__":
  tf.test.main()
