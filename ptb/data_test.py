"""Tests of ptb/data.py: the PTB found, downloaded, checked and cached.

Archives are built here and served by a local HTTP server on 127.0.0.1;
the runs are real processes of ptb_word_lm.py. Never the network.
"""

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

# Generated stand-ins for the three files: fine as a corpus, wrong as PTB,
# random enough that their archive is tens of KB.
_RNG = random.Random(0)
FAKE = {name: "".join(" w%d" % _RNG.randrange(1000) + ("\n" if i % 20 == 19
                                                         else "")
                      for i in range(5000)).encode()
        for name in data_lib.MD5SUMS}


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
  this many seconds before the rest (time to send a signal).
  """

  def __init__(self, files, cut_at=None, stall=0.0):
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # pylint: disable=invalid-name
        body = outer.files.get(self.path)
        if body is None:
          self.send_error(404, "Not Found")
          return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = body if cut_at is None else body[:cut_at]
        self.wfile.write(sent[:65536])
        self.wfile.flush()
        time.sleep(stall)
        self.wfile.write(sent[65536:])

      def log_message(self, *_):
        pass

    self.files = files
    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.httpd.daemon_threads = True
    self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]

  def __enter__(self):
    threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
    return self

  def __exit__(self, *_):
    self.httpd.shutdown()
    self.httpd.server_close()


def dead_url():
  """A URL on 127.0.0.1 where nothing listens."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return "http://127.0.0.1:%d/simple-examples.tgz" % port


def files_under(directory):
  return [os.path.join(d, f) for d, _, names in os.walk(directory)
          for f in names]


class DownloadTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.cache = os.path.join(tmp.name, "cache")
    self.tmp = tmp.name

  def env(self, url):
    env = dict(os.environ, XDG_CACHE_HOME=self.cache, PTB_DATA_URL=url,
               PTB_LSTM_KERNELS="0")
    env.pop("PTB_DATA_PATH", None)
    return env

  def assertFailsAndLeavesNothing(self, url, pattern, env=None):
    _, err = testing.assert_user_error(
        self, ["--model=test", "--num_gpus=0"], pattern,
        env=env or self.env(url))
    self.assertEqual(files_under(os.path.join(self.cache, "ptb_word_lm")),
                     [], err)
    return err

  def testArchiveOfThePtbFillsTheCacheAndLaterRunsNeedNoServer(self):
    source = data_lib.local_data_dir()
    if source is None:
      self.skipTest("no real PTB here: set PTB_DATA_PATH")
    real = {}
    for name in data_lib.MD5SUMS:
      with open(os.path.join(source, name), "rb") as f:
        real[name] = f.read()
    archive = make_archive(real)
    archive_with_more = make_archive(dict(real, **{"README": b"x"}))
    self.assertGreater(len(archive_with_more), len(archive))
    # What is tested here is where the data comes from, so the runs make
    # fewer session calls than the test config's (half the time).
    short = ("--model=test", "--num_gpus=0", "--seed=1", "--eval_unroll=100",
             "--config_overrides=num_steps=20,batch_size=64")
    with Server({"/simple-examples.tgz": archive_with_more}) as server:
      code, out, err = testing.run_script(
          *short, env=self.env(server.url + "/simple-examples.tgz"))
    self.assertEqual(code, 0, err)
    self.assertIn("Downloading %s/simple-examples.tgz" % server.url, err)
    target = data_lib.cached_data_dir().replace(
        data_lib.cache_root(), os.path.join(self.cache, "ptb_word_lm"))
    self.assertIn("PTB data downloaded from %s/simple-examples.tgz and "
                  "checked: %s" % (server.url, target), err)
    test_line = [l for l in out.splitlines() if l.startswith("Test ")]
    self.assertLen(test_line, 1)
    # Only the three files, checked; no temporary directory left.
    self.assertCountEqual(
        files_under(os.path.join(self.cache, "ptb_word_lm")),
        [os.path.join(target, n) for n in data_lib.MD5SUMS])
    for name, want in data_lib.MD5SUMS.items():
      self.assertEqual(data_lib.file_md5(os.path.join(target, name)), want)
    # The server is gone: the cache serves the next run.
    code, out2, err = testing.run_script(*short, env=self.env(dead_url()))
    self.assertEqual(code, 0, err)
    self.assertIn("PTB data from the cache: %s" % target, err)
    self.assertNotIn("Downloading", err)
    self.assertIn(test_line[0], out2.splitlines())

  def testHttpError(self):
    with Server({}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/simple-examples.tgz",
          r"cannot download http://127\.0\.0\.1:\d+/simple-examples\.tgz: "
          r"HTTP 404 Not Found; download it by hand \(curl -O .*\) and pass "
          r"--data_path=simple-examples/data")

  def testDeadServer(self):
    self.assertFailsAndLeavesNothing(
        dead_url(), r"cannot download http://127\.0\.0\.1:\d+/simple-"
        r"examples\.tgz: .*refused.*; download it by hand")

  def testTruncatedArchive(self):
    archive = make_archive(FAKE)
    half = archive[:len(archive) // 2]
    with Server({"/a.tgz": half}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz", r"a\.tgz is not a complete \.tgz archive")

  def testInterruptedDownload(self):
    archive = make_archive(FAKE)
    with Server({"/a.tgz": archive}, cut_at=len(archive) // 2) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz",
          r"the download of .*a\.tgz stopped after %d of %d bytes"
          % (len(archive) // 2, len(archive)))

  def testFileWhoseSumDiffers(self):
    with Server({"/a.tgz": make_archive(FAKE)}) as server:
      self.assertFailsAndLeavesNothing(
          server.url + "/a.tgz",
          r"ptb\.\w+\.txt from .*a\.tgz has MD5 %s, not the published "
          r"[0-9a-f]{32}; nothing was kept"
          % hashlib.md5(FAKE["ptb.train.txt"]).hexdigest())

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
          r"data/ptb\.test\.txt")

  def testCacheThatCannotBeWritten(self):
    blocker = os.path.join(self.tmp, "a_file")
    with open(blocker, "w") as f:
      f.write("x")
    env = self.env(dead_url())
    env["XDG_CACHE_HOME"] = blocker
    testing.assert_user_error(
        self, ["--model=test", "--num_gpus=0"],
        r"the cache directory .*a_file/ptb_word_lm cannot be written "
        r"\(.*\); set XDG_CACHE_HOME", env=env)

  def _interrupt_download(self, send):
    """Starts a download from a server that stalls, then send(pid).

    Returns:
      (the exit status, stderr, seconds from the signal to the exit).
    """
    big = make_archive({"README": os.urandom(200000)})
    # A suite started in the background by a shell (`cmd &`) ignores
    # SIGINT, and a child inherits an ignored signal (it would never stop):
    # with a handler here while it starts, the child gets the default.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with Server({"/a.tgz": big}, stall=60) as server:
      try:
        proc = subprocess.Popen(
            [sys.executable, testing.SCRIPT, "--model=test", "--num_gpus=0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=testing.HERE, env=self.env(server.url + "/a.tgz"))
      finally:
        signal.signal(signal.SIGINT, previous)
      lines = []
      for line in proc.stderr:
        lines.append(line)
        if line.startswith("Downloading"):
          break
      time.sleep(0.5)  # into the read of the stalled body
      start = time.time()
      send(proc.pid)
      _, err = proc.communicate(timeout=30)   # the stall lasts 60 s
    return proc.returncode, "".join(lines) + err, time.time() - start

  def testCtrlCDuringTheDownloadLeavesNothing(self):
    returncode, err, _ = self._interrupt_download(
        lambda pid: os.kill(pid, signal.SIGINT))
    self._assert_stopped(returncode, err)

  def testCtrlCTakenByAnotherThreadStopsTheDownloadAtOnce(self):
    # The kernel hands a process's signal to any of its threads. Sent to one
    # that is not the main thread (TensorFlow's, or the transfer's), it must
    # still stop the download at once, not when the server's 60 s stall
    # ends.
    tgkill = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)
    if tgkill is None or not os.path.isdir("/proc/self/task"):
      self.skipTest("needs Linux's tgkill on x86_64 or aarch64")
    libc = ctypes.CDLL(None, use_errno=True)

    def to_another_thread(pid):
      tid = max(int(t) for t in os.listdir("/proc/%d/task" % pid))
      self.assertNotEqual(tid, pid)
      self.assertEqual(libc.syscall(tgkill, pid, tid, signal.SIGINT), 0)

    returncode, err, seconds = self._interrupt_download(to_another_thread)
    self._assert_stopped(returncode, err)
    self.assertLess(seconds, 30)

  def _assert_stopped(self, returncode, err):
    """The exit of a download stopped by Ctrl-C: 130, a line, no cache."""
    self.assertEqual(returncode, 130, err)
    self.assertNotIn("Traceback", err)
    self.assertRegex(err, r"ptb_word_lm\.py: interrupted during the download "
                     r"of .*a\.tgz; nothing was kept in the cache")
    self.assertEqual(files_under(os.path.join(self.cache, "ptb_word_lm")), [])


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
    sums = {name: hashlib.md5(body).hexdigest() for name, body in FAKE.items()}
    archive = make_archive(FAKE)
    with tempfile.TemporaryDirectory() as tmp, Server(
        {"/a.tgz": archive}, stall=0.5) as server, mock.patch.dict(
            os.environ, {"XDG_CACHE_HOME": tmp,
                         "PTB_DATA_URL": server.url + "/a.tgz"}), \
        mock.patch.dict(data_lib.MD5SUMS, sums):
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
      self.assertEqual(results, [data_lib.cached_data_dir()] * 2)
      self.assertCountEqual(
          files_under(os.path.join(tmp, "ptb_word_lm")),
          [os.path.join(data_lib.cached_data_dir(), n) for n in FAKE])


if __name__ == "__main__":
  tf.test.main()
