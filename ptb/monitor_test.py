"""Tests for monitor.py."""

import csv
import ctypes
import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

from ptb import monitor


def _read_csv(path):
  """Returns (header, rows) of a CSV file, rows as lists of strings."""
  with open(path, newline="") as f:
    lines = list(csv.reader(f))
  return lines[0], lines[1:]


class RssTest(unittest.TestCase):

  def testCurrentRssGrowsWithTouchedMemory(self):
    before = monitor.current_rss_mib()
    self.assertGreater(before, 0)
    size = 64 * 1024 * 1024
    buf = bytearray(size)
    # Zeroed pages may not be resident until written: touch one per page.
    buf[::4096] = b"\x01" * len(range(0, size, 4096))
    after = monitor.current_rss_mib()
    self.assertGreaterEqual(after - before, 40)
    # The current RSS first: the test process's other threads map and free
    # pages between two reads (the other order once failed by 4 KiB in CI),
    # hence also the MiB of slack.
    current = monitor.current_rss_mib()
    self.assertGreaterEqual(monitor.peak_rss_mib(), current - 1.0)
    del buf

  def testPageFaultsCountEachFreshPage(self):
    # A private anonymous mapping, as malloc makes for a large block, faults
    # once a page at its first write (huge pages turned off for it), and
    # again once it has been unmapped and mapped anew: what a malloc that
    # returns large blocks costs every step.
    pages = 4096
    for _ in range(2):
      with mmap.mmap(-1, pages * mmap.PAGESIZE,
                     flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as m:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
          m.madvise(mmap.MADV_NOHUGEPAGE)
        before = monitor.page_faults()
        for offset in range(0, pages * mmap.PAGESIZE, mmap.PAGESIZE):
          m[offset] = 1
        self.assertGreaterEqual(monitor.page_faults() - before, pages)

  def testPeakIsNeverBelowTheCurrentRssWhenTheHighWaterMarkLags(self):
    with mock.patch.object(monitor, "_rusage_peak_mib", return_value=100.0), \
         mock.patch.object(monitor, "_statm_rss_mib", return_value=100.5):
      self.assertEqual(monitor.current_rss_mib(), 100.5)
      self.assertEqual(monitor.peak_rss_mib(), 100.5)
    with mock.patch.object(monitor, "_rusage_peak_mib", return_value=300.0), \
         mock.patch.object(monitor, "_statm_rss_mib", return_value=100.5):
      self.assertEqual(monitor.peak_rss_mib(), 300.0)


# Run by a fresh interpreter: the settings, whether Keras could still be
# imported (a None entry in sys.modules makes its import raise ImportError),
# and whether TensorFlow came in.
_FOOTPRINT_PROBE = """
import sys
from ptb import monitor
limited = monitor.reduce_memory_footprint()
keras_importable = sys.modules.get("keras", "not blocked") is not None
print(limited, keras_importable, "tensorflow" in sys.modules)
"""


class ReduceMemoryFootprintTest(unittest.TestCase):
  """In a fresh interpreter each: the settings are for the whole process.

  The interpreter does not import TensorFlow: a fresh import of it (its
  libraries read, thousands of ops registered) was all the time these tests
  took, seconds alone and up to minutes on a loaded machine. That
  TensorFlow then runs without Keras, the programs' own start shows
  (ptb_word_lm_test's EntryPointTest, benchmark_test's command line).
  """

  def _run(self, env):
    """Runs the probe; returns whether it set the arena limit ("True")."""
    proc = subprocess.run([sys.executable, "-c", _FOOTPRINT_PROBE],
                          capture_output=True, text=True, timeout=600,
                          env=env, cwd=os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__))))
    self.assertEqual(proc.returncode, 0, msg=proc.stderr[-2000:])
    limited, keras_importable, tensorflow_imported = proc.stdout.split()
    self.assertEqual(keras_importable, "False")  # as TensorFlow's import fails
    self.assertEqual(tensorflow_imported, "False")
    return limited

  def testKerasIsBlockedAndArenasAreLimited(self):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    limited = self._run(env)
    if sys.platform.startswith("linux") and os.confstr(
        "CS_GNU_LIBC_VERSION"):
      self.assertEqual(limited, "True")

  def testEnvironmentArenaLimitWins(self):
    self.assertEqual(self._run(dict(os.environ, MALLOC_ARENA_MAX="4")),
                     "False")


_SMAPS = """\
55d0a0000000-55d0a0001000 r--p 00000000 fd:01 11 /usr/bin/python3.11
Rss:                   4 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000000000-7f0000100000 r-xp 00001000 fd:01 12 /opt/lib/libtensorflow_cc.so.2
Size:               1024 kB
Rss:                 512 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
VmFlags: rd ex mr mw me sd
7f0000100000-7f0000180000 r--p 00101000 fd:01 12 /opt/lib/libtensorflow_cc.so.2
Rss:                 300 kB
Private_Dirty:        12 kB
Anonymous:            12 kB
7f0000180000-7f0000190000 rw-p 00181000 fd:01 12 /opt/lib/libtensorflow_cc.so.2
Rss:                  64 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000200000-7f0000210000 r--p 00000000 fd:01 13 /opt/lib/_umath.cpython-311-x86_64-linux-gnu.so
Rss:                  40 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000210000-7f0000220000 r-xp 00000000 fd:01 14 /opt/lib/libhdf5-8c29.so.310.5.1
Rss:                   0 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000220000-7f0000230000 r--s 00000000 fd:01 15 /opt/lib/libshared.so
Rss:                  16 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000230000-7f0000240000 r-xp 00000000 fd:01 16 /opt/lib/libgone.so (deleted)
Rss:                  16 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000240000-7f0000250000 r--p 00000000 fd:01 17 /data/ptb.train.txt.so.tmp
Rss:                  16 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
7f0000300000-7f0000400000 rw-p 00000000 0:0 0 [heap]
Rss:                1024 kB
Anonymous:          1024 kB
7f0000400000-7f0000410000 r-xp 00000000 fd:01 18 /opt/lib/libm.so.6
Rss:                  24 kB
Anonymous:             0 kB
Private_Dirty:         0 kB
"""


class ReleaseLibraryPagesTest(unittest.TestCase):

  def testSelectsOnlyUnwrittenPrivateReadOnlySharedObjects(self):
    self.assertEqual(
        list(monitor._releasable_mappings(_SMAPS.splitlines(True))),
        [(0x7f0000000000, 0x100000, 512),  # code
         (0x7f0000200000, 0x10000, 40),  # an extension module's constants
         (0x7f0000400000, 0x10000, 24)])  # the last mapping of the file

  @unittest.skipUnless(sys.platform.startswith("linux"), "needs /proc, madvise")
  def testReleasesCleanPagesAndKeepsCopiedOnes(self):
    # Two private mappings of a file named like a shared object: one only
    # read, one written (copied on write) and then made read-only, as the
    # dynamic loader does with relocated data.
    size = 64 * mmap.PAGESIZE
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "libfake.so.1")
      with open(path, "wb") as f:
        f.write(bytes(range(256)) * (size // 256))
        # Dirty page-cache pages count as Private_Dirty, which is kept.
        f.flush()
        os.fsync(f.fileno())
      with open(path, "rb") as f:
        clean = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                          prot=mmap.PROT_READ)
        written = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
      self.addCleanup(clean.close)
      self.addCleanup(written.close)
      written[:4] = b"edit"
      libc = ctypes.CDLL(None, use_errno=True)
      libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
      address = ctypes.addressof(ctypes.c_char.from_buffer(written))
      self.assertEqual(libc.mprotect(address, size, mmap.PROT_READ), 0)
      # Touch every page of both.
      self.assertEqual(sum(clean[::mmap.PAGESIZE]), 0)
      self.assertEqual(sum(written[mmap.PAGESIZE::mmap.PAGESIZE]), 0)

      def rss_kib(target):
        with open("/proc/self/smaps") as f:
          lines = f.read().splitlines()
        for i, line in enumerate(lines):
          if line.startswith("%x-" % target):
            return next(int(l.split()[1]) for l in lines[i + 1:]
                        if l.startswith("Rss:"))
        self.fail("no mapping at %x" % target)

      # A read-only mmap gives no address; find it by its path.
      with open("/proc/self/maps") as f:
        starts = [int(l.split("-")[0], 16) for l in f
                  if l.rstrip().endswith(path)]
      self.assertEqual(len(starts), 2)
      clean_start = next(s for s in starts if s != address)
      self.assertEqual(rss_kib(clean_start), size // 1024)
      self.assertEqual(rss_kib(address), size // 1024)

      self.assertGreaterEqual(monitor.release_library_pages(), size / 2**20)

      self.assertEqual(rss_kib(clean_start), 0)
      self.assertEqual(rss_kib(address), size // 1024)  # not released
      self.assertEqual(written[:6], b"edit\x04\x05")
      self.assertEqual(clean[:6], bytes(range(6)))  # read back from the file
      self.assertEqual(clean[-1], 255)


class FakeClock:
  """A clock that moves only when a test advances it."""

  def __init__(self, now=1000.0):
    self.now = now

  def __call__(self):
    return self.now

  def advance(self, seconds):
    self.now += seconds


class ScriptedWait:
  """A sampler's wait function that lets a script drive the thread.

  The thread's call k (from 0) lets its `interval` pass on the fake clock
  and returns False, so the thread then writes a row; `script[k]`, if not
  None, runs halfway through, as the main thread's set_phase would during
  a real wait. The call after the last entry returns True, which ends the
  thread, and sets `done`. Everything thus happens on the sampling thread,
  in an order fixed by the script rather than by the scheduler.
  """

  def __init__(self, clock, script=()):
    self._clock = clock
    self._script = list(script)
    self.timeouts = []
    self.done = threading.Event()

  def __call__(self, timeout):
    self.timeouts.append(timeout)
    if len(self.timeouts) > len(self._script):
      self.done.set()
      return True
    action = self._script[len(self.timeouts) - 1]
    self._clock.advance(timeout / 2)
    if action is not None:
      action()
    self._clock.advance(timeout / 2)
    return False


def _no_interval_rows(timeout):
  """A wait function that ends the sampling thread before its first row."""
  del timeout
  return True


class FakeRss:
  """Stands in for monitor.current_rss_mib: the given values, in order."""

  def __init__(self, values):
    self._values = list(values)
    self.calls = 0

  def __call__(self):
    value = self._values[self.calls]
    self.calls += 1
    return value


class MemorySamplerTest(unittest.TestCase):
  """Driven by a fake clock and counted waits: no test depends on speed."""

  # Long enough that no real wait ends during a test.
  HOUR = 3600.0

  def setUp(self):
    super().setUp()
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)
    self._path = os.path.join(self._tmp.name, "memory.csv")

  def _stop_promptly(self, sampler):
    """Calls sampler.stop(), failing if it takes more than a few seconds.

    stop() runs on a thread of its own, so a stop() that hangs fails the
    test instead of hanging it. A bound with ample slack for a loaded
    machine: stopping takes no more than a thread switch.
    """
    stopper = threading.Thread(target=sampler.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=10)
    self.assertFalse(stopper.is_alive(), "stop() did not wake the thread")

  def _stop_after_script(self, sampler, wait, clock, seconds):
    """Lets the thread finish `wait`'s script, moves the clock, stops."""
    # An upper bound only: the script needs no real time to run.
    self.assertTrue(wait.done.wait(timeout=30), "the script did not finish")
    clock.advance(seconds)
    self._stop_promptly(sampler)

  def testHeaderIntervalRowsAndPhase(self):
    clock = FakeClock()
    sampler = None  # bound below; the script runs after start()
    wait = ScriptedWait(clock, [
        None, None,
        lambda: sampler.set_phase("train", 2, 17),  # a row of its own
        lambda: sampler.set_phase("train", 2, 18),  # same phase: no row
        None])
    rss = FakeRss([100.0, 150.5, 120.0, 201.5, 130.0, 140.0, 110.0, 105.0])
    with mock.patch.object(monitor, "current_rss_mib", rss):
      sampler = monitor.MemorySampler(self._path, interval=2.0, clock=clock,
                                      wait=wait)
      sampler.start()
      self._stop_after_script(sampler, wait, clock, 0.25)

    header, rows = _read_csv(self._path)
    self.assertEqual(header, ["seconds", "rss_mib", "phase", "epoch", "step"])
    self.assertEqual(rows, [
        ["0.000", "100.0", "startup", "0", "0"],  # start()
        ["2.000", "150.5", "startup", "0", "0"],
        ["4.000", "120.0", "startup", "0", "0"],
        ["5.000", "201.5", "train", "2", "17"],  # set_phase
        ["6.000", "130.0", "train", "2", "17"],
        ["8.000", "140.0", "train", "2", "18"],  # the step set in between
        ["10.000", "110.0", "train", "2", "18"],
        ["10.250", "105.0", "train", "2", "18"]])  # stop()
    self.assertEqual(wait.timeouts, [2.0] * 6)
    self.assertEqual(rss.calls, len(rows))
    self.assertEqual(sampler.peak_rss_mib, 201.5)

  def testPhaseChangeWritesRowAtOnce(self):
    # A phase far shorter than the interval still gets a row of its own;
    # the thread writes none here, so every row below is set_phase's.
    clock = FakeClock()
    sampler = monitor.MemorySampler(self._path, interval=self.HOUR,
                                    clock=clock, wait=_no_interval_rows)
    sampler.set_phase("startup", 0, 0)  # before start(): nothing to write
    sampler.sample()
    self.assertFalse(os.path.exists(self._path))
    sampler.start()
    clock.advance(0.5)
    sampler.set_phase("train", 1, 0)
    clock.advance(0.25)
    sampler.set_phase("train", 1, 1)  # same phase: no row
    sampler.set_phase("train", 1, 2)
    clock.advance(0.25)
    sampler.set_phase("valid", 1, 0)
    # Flushed as written: a killed run keeps them.
    _, rows = _read_csv(self._path)
    self.assertEqual([[r[0]] + r[2:] for r in rows[1:]],
                     [["0.500", "train", "1", "0"],
                      ["1.000", "valid", "1", "0"]])
    clock.advance(1.0)
    sampler.set_phase("train", 2, 0)  # a new epoch, same phase name
    clock.advance(1.0)
    sampler.set_phase("test", 2, 0)
    clock.advance(0.25)
    sampler.set_phase("test", 2, 7)
    clock.advance(0.25)
    self._stop_promptly(sampler)
    clock.advance(1.0)
    sampler.set_phase("valid", 3, 0)  # after stop: nothing written
    sampler.sample()
    sampler.stop()  # a second stop does nothing

    _, rows = _read_csv(self._path)
    self.assertEqual([[r[0]] + r[2:] for r in rows],
                     [["0.000", "startup", "0", "0"],
                      ["0.500", "train", "1", "0"],
                      ["1.000", "valid", "1", "0"],
                      ["2.000", "train", "2", "0"],
                      ["3.000", "test", "2", "0"],
                      ["3.500", "test", "2", "7"]])  # stop()
    self.assertTrue(all(float(r[1]) > 0 for r in rows))

  def _two_process_log(self, cut_last_row):
    """A killed process's log (no stop() row), then an appending one's."""
    with open(self._path, "w", newline="") as f:
      f.write("seconds,rss_mib,phase,epoch,step\r\n0.000,600.0,startup,0,0\r\n"
              "1.000,610.0,train,1,0\r\n3.500,620.0,valid,1,0\r\n")
      if cut_last_row:
        f.write("3.9")   # a row the kill cut short
    clock = FakeClock(now=50.0)
    second = monitor.MemorySampler(self._path, interval=self.HOUR,
                                   append=True, clock=clock,
                                   wait=_no_interval_rows).start()
    clock.advance(2.0)
    second.set_phase("train", 2, 0)
    clock.advance(0.5)
    self._stop_promptly(second)
    header, rows = _read_csv(self._path)
    self.assertEqual(header, list(second.columns))
    return [[r[0]] + r[2:] for r in rows]

  def testAppendContinuesTheLogAndItsSeconds(self):
    for cut_last_row in (False, True):
      self.assertEqual(self._two_process_log(cut_last_row), [
          ["0.000", "startup", "0", "0"],
          ["1.000", "train", "1", "0"],
          ["3.500", "valid", "1", "0"],
          ["3.500", "startup", "0", "0"],   # the second process starts
          ["5.500", "train", "2", "0"],
          ["6.000", "train", "2", "0"]], cut_last_row)

  def testAppendReplacesALogOfOtherColumnsOrNone(self):
    with open(self._path, "w") as f:
      f.write("seconds,rss_mib\n0.0,100.0\n")
    clock = FakeClock()
    with mock.patch.object(monitor, "warn") as warn:
      monitor.MemorySampler(self._path, interval=self.HOUR, append=True,
                            clock=clock, wait=_no_interval_rows).start().stop()
    warn.assert_called_once_with(
        "the memory log %s has other columns than seconds,rss_mib,phase,"
        "epoch,step; it is replaced" % self._path)
    header, rows = _read_csv(self._path)
    self.assertEqual(header, ["seconds", "rss_mib", "phase", "epoch", "step"])
    self.assertEqual([r[0] for r in rows], ["0.000", "0.000"])
    os.remove(self._path)
    with mock.patch.object(monitor, "warn") as warn:  # no log: a new one
      monitor.MemorySampler(self._path, interval=self.HOUR, append=True,
                            clock=clock, wait=_no_interval_rows).start().stop()
    warn.assert_not_called()
    self.assertEqual(len(_read_csv(self._path)[1]), 2)

  def testGpuColumns(self):
    calls = []

    def fake_memory_info(name):
      calls.append(name)
      # Distinct values per call and device, so a shifted or swapped
      # column shows.
      n = len(calls)
      return {"current": 1000 * n, "peak": 1000 * n + 1}

    clock = FakeClock()
    wait = ScriptedWait(clock, [None])
    sampler = monitor.MemorySampler(
        self._path, interval=10.0, gpu_memory_fn=fake_memory_info,
        gpu_names=("GPU:0", "GPU:1"), clock=clock, wait=wait).start()
    self._stop_after_script(sampler, wait, clock, 1.0)

    header, rows = _read_csv(self._path)
    self.assertEqual(header, ["seconds", "rss_mib", "phase", "epoch", "step",
                              "gpu0_bytes_in_use", "gpu0_peak_bytes",
                              "gpu1_bytes_in_use", "gpu1_peak_bytes"])
    self.assertEqual(sampler.columns, tuple(header))
    self.assertEqual([[r[0]] + r[2:] for r in rows], [
        ["0.000", "startup", "0", "0", "1000", "1001", "2000", "2001"],
        ["10.000", "startup", "0", "0", "3000", "3001", "4000", "4001"],
        ["11.000", "startup", "0", "0", "5000", "5001", "6000", "6001"]])
    self.assertEqual(calls, ["GPU:0", "GPU:1"] * 3)

  def testFailingGpuProbeLeavesEmptyCells(self):

    def memory_info(name):
      if name == "GPU:1":
        raise ValueError("no memory info for %s" % name)
      return {"current": 5, "peak": 7}

    clock = FakeClock()
    wait = ScriptedWait(clock, [None, None])
    sampler = monitor.MemorySampler(
        self._path, gpu_memory_fn=memory_info, gpu_names=("GPU:0", "GPU:1"),
        clock=clock, wait=wait).start()
    self._stop_after_script(sampler, wait, clock, 1.0)

    header, rows = _read_csv(self._path)
    self.assertEqual(header[5:], ["gpu0_bytes_in_use", "gpu0_peak_bytes",
                                  "gpu1_bytes_in_use", "gpu1_peak_bytes"])
    # The thread went on sampling after the probe failed in it.
    self.assertEqual([[r[0]] + r[5:] for r in rows],
                     [["0.000", "5", "7", "", ""],
                      ["2.000", "5", "7", "", ""],
                      ["4.000", "5", "7", "", ""],
                      ["5.000", "5", "7", "", ""]])

  def testDefaultWaitSamplesEveryInterval(self):
    # The real clock and wait. Only an upper bound on time: the test waits
    # for the thread's first row however long the machine takes, up to a
    # minute, and counts nothing over a fixed time.
    lock = threading.Lock()
    probes = []
    thread_row = threading.Event()

    def memory_info(name):
      del name
      with lock:
        probes.append(threading.current_thread().name)
      if threading.current_thread().name == "MemorySampler":
        thread_row.set()
      return {"current": 0, "peak": 0}

    sampler = monitor.MemorySampler(self._path, interval=0.01,
                                    gpu_memory_fn=memory_info,
                                    gpu_names=("GPU:0",)).start()
    self.assertTrue(thread_row.wait(timeout=60), "the thread never sampled")
    self._stop_promptly(sampler)

    _, rows = _read_csv(self._path)
    self.assertGreaterEqual(len(rows), 3)  # start, the thread's, stop
    self.assertEqual(len(rows), len(probes))
    self.assertNotEqual(probes[0], "MemorySampler")  # start() writes its own
    seconds = [float(r[0]) for r in rows]
    self.assertEqual(seconds, sorted(seconds))
    self.assertGreaterEqual(seconds[-1], 0.01)
    self.assertTrue(all(r[2:5] == ["startup", "0", "0"] for r in rows))

  def testStopIsPromptWithLongInterval(self):
    # The real clock and wait: stop() must end the thread's hour-long wait.
    sampler = monitor.MemorySampler(self._path, interval=self.HOUR).start()
    self._stop_promptly(sampler)
    sampler.stop()  # a second stop does nothing
    _, rows = _read_csv(self._path)
    self.assertEqual([r[2:] for r in rows], [["startup", "0", "0"]] * 2)

  def testAFullDiskStopsTheLogWithTheReason(self):
    # Every write to /dev/full fails with ENOSPC, as on a full disk.
    sampler = monitor.MemorySampler("/dev/full", interval=self.HOUR,
                                    clock=FakeClock(), wait=_no_interval_rows)
    with mock.patch.object(monitor, "warn") as warn:
      sampler.start()
      sampler.set_phase("train", 1, 0)
      self._stop_promptly(sampler)
    warn.assert_called_once_with(
        "the memory log /dev/full can no longer be written (No space left on "
        "device); it keeps the rows written before and stops there, the "
        "training goes on")

  def testRejectsBadArguments(self):
    for interval in (0, -1.0):
      with self.assertRaises(ValueError):
        monitor.MemorySampler(self._path, interval=interval)
    with self.assertRaises(ValueError):
      monitor.MemorySampler(self._path, gpu_names=("GPU:0",))
    self.assertFalse(os.path.exists(self._path))

  def testStartTwiceRaises(self):
    with monitor.MemorySampler(self._path, wait=_no_interval_rows) as sampler:
      with self.assertRaises(RuntimeError):
        sampler.start()
    _, rows = _read_csv(self._path)
    self.assertEqual(len(rows), 2)  # the first start's row and stop's


class WriteJsonAtomicTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)
    self._path = os.path.join(self._tmp.name, "summary.json")

  def _load(self):
    with open(self._path) as f:
      return json.load(f)

  def testWritesAndReplaces(self):
    monitor.write_json_atomic(self._path, {"status": "running", "epochs": []})
    self.assertEqual(self._load(), {"status": "running", "epochs": []})
    self.assertEqual(os.listdir(self._tmp.name), ["summary.json"])

    monitor.write_json_atomic(self._path, {"status": "finished"})
    self.assertEqual(self._load(), {"status": "finished"})
    self.assertEqual(os.listdir(self._tmp.name), ["summary.json"])

  def testKeepsKeyOrderAndIndent(self):
    monitor.write_json_atomic(self._path, {"b": 1, "a": [1]})
    with open(self._path) as f:
      text = f.read()
    self.assertEqual(text, '{\n  "b": 1,\n  "a": [\n    1\n  ]\n}\n')

  def testFailedWriteKeepsOldFile(self):
    monitor.write_json_atomic(self._path, {"status": "running"})
    with self.assertRaises(TypeError):
      monitor.write_json_atomic(self._path, {"bad": object()})
    self.assertEqual(self._load(), {"status": "running"})
    self.assertEqual(os.listdir(self._tmp.name), ["summary.json"])


if __name__ == "__main__":
  unittest.main()
