"""Tests for monitor.py."""

import csv
import ctypes
import json
import mmap
import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import monitor


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

  def testPeakIsNeverBelowTheCurrentRssWhenTheHighWaterMarkLags(self):
    with mock.patch.object(monitor, "_rusage_peak_mib", return_value=100.0), \
         mock.patch.object(monitor, "_statm_rss_mib", return_value=100.5):
      self.assertEqual(monitor.current_rss_mib(), 100.5)
      self.assertEqual(monitor.peak_rss_mib(), 100.5)
    with mock.patch.object(monitor, "_rusage_peak_mib", return_value=300.0), \
         mock.patch.object(monitor, "_statm_rss_mib", return_value=100.5):
      self.assertEqual(monitor.peak_rss_mib(), 300.0)

  def testModuleLoadsNoHeavyLibraries(self):
    self.assertIn("monitor", sys.modules)
    with open(monitor.__file__) as f:
      source = f.read()
    self.assertNotIn("import tensorflow", source)
    self.assertNotIn("import matplotlib", source)


class ReduceMemoryFootprintTest(unittest.TestCase):
  """In a fresh interpreter each: the settings are for the whole process."""

  def _run(self, env):
    code = ("import sys, monitor; limited = monitor.reduce_memory_footprint();"
            "import tensorflow; print(limited, 'keras' in sys.modules and "
            "sys.modules['keras'] is not None)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=600, env=env,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    self.assertEqual(proc.returncode, 0, msg=proc.stderr[-2000:])
    return proc.stdout.split()

  def testTensorFlowImportsWithoutKerasAndArenasAreLimited(self):
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    limited, keras_loaded = self._run(env)
    self.assertEqual(keras_loaded, "False")
    if sys.platform.startswith("linux") and os.confstr(
        "CS_GNU_LIBC_VERSION"):
      self.assertEqual(limited, "True")

  def testEnvironmentArenaLimitWins(self):
    limited, _ = self._run(dict(os.environ, MALLOC_ARENA_MAX="4"))
    self.assertEqual(limited, "False")


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
7f0000300000-7f0000400000 rw-p 00000000 00:00 0 [heap]
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


class MemorySamplerTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)
    self._path = os.path.join(self._tmp.name, "memory.csv")

  def testRowsHeaderAndPhase(self):
    sampler = monitor.MemorySampler(self._path, interval=0.05)
    sampler.start()
    time.sleep(0.3)
    sampler.set_phase("train", 2, 17)
    time.sleep(0.3)
    sampler.stop()

    header, rows = _read_csv(self._path)
    self.assertEqual(header, ["seconds", "rss_mib", "phase", "epoch", "step"])
    self.assertGreaterEqual(len(rows), 8)
    seconds = [float(r[0]) for r in rows]
    self.assertEqual(seconds, sorted(seconds))
    rss = [float(r[1]) for r in rows]
    self.assertTrue(all(v > 0 for v in rss))
    self.assertEqual(rows[0][2:], ["startup", "0", "0"])
    self.assertEqual(rows[-1][2:], ["train", "2", "17"])
    # Once switched, the phase never goes back.
    first_train = [r[2] for r in rows].index("train")
    self.assertTrue(all(r[2:] == ["train", "2", "17"]
                        for r in rows[first_train:]))
    self.assertAlmostEqual(sampler.peak_rss_mib, max(rss), delta=0.1)

  def testPhaseChangeWritesRowAtOnce(self):
    # A phase far shorter than the interval still gets a row of its own.
    sampler = monitor.MemorySampler(self._path, interval=60.0).start()
    sampler.set_phase("train", 1, 0)
    sampler.set_phase("train", 1, 1)  # same phase: no row
    sampler.set_phase("train", 1, 2)
    sampler.set_phase("valid", 1, 0)
    sampler.set_phase("train", 2, 0)
    sampler.set_phase("test", 2, 0)
    sampler.stop()
    sampler.set_phase("valid", 3, 0)  # after stop: nothing written

    _, rows = _read_csv(self._path)
    self.assertEqual([r[2:] for r in rows],
                     [["startup", "0", "0"], ["train", "1", "0"],
                      ["valid", "1", "0"], ["train", "2", "0"],
                      ["test", "2", "0"], ["test", "2", "0"]])
    seconds = [float(r[0]) for r in rows]
    self.assertEqual(seconds, sorted(seconds))

  def testGpuColumns(self):
    names = []

    def fake_memory_info(name):
      names.append(name)
      return {"current": 1048576, "peak": 2097152}

    with monitor.MemorySampler(self._path, interval=10.0,
                               gpu_memory_fn=fake_memory_info,
                               gpu_names=("GPU:0",)):
      pass

    header, rows = _read_csv(self._path)
    self.assertEqual(header, ["seconds", "rss_mib", "phase", "epoch", "step",
                              "gpu0_bytes_in_use", "gpu0_peak_bytes"])
    self.assertEqual(len(rows), 2)  # the start row and the stop row
    for row in rows:
      self.assertEqual(row[5:], ["1048576", "2097152"])
    self.assertEqual(set(names), {"GPU:0"})

  def testFailingGpuProbeLeavesEmptyCells(self):

    def broken_memory_info(name):
      raise ValueError("no memory info for %s" % name)

    with monitor.MemorySampler(self._path, gpu_memory_fn=broken_memory_info,
                               gpu_names=("GPU:1",)):
      pass
    header, rows = _read_csv(self._path)
    self.assertEqual(header[5:], ["gpu1_bytes_in_use", "gpu1_peak_bytes"])
    self.assertEqual([r[5:] for r in rows], [["", ""], ["", ""]])

  def testStopIsPromptWithLongInterval(self):
    sampler = monitor.MemorySampler(self._path, interval=60.0).start()
    begin = time.monotonic()
    sampler.stop()
    self.assertLess(time.monotonic() - begin, 2.0)
    sampler.stop()  # a second stop does nothing
    _, rows = _read_csv(self._path)
    self.assertEqual(len(rows), 2)

  def testRejectsBadArguments(self):
    with self.assertRaises(ValueError):
      monitor.MemorySampler(self._path, interval=0)
    with self.assertRaises(ValueError):
      monitor.MemorySampler(self._path, gpu_names=("GPU:0",))

  def testStartTwiceRaises(self):
    with monitor.MemorySampler(self._path, interval=60.0) as sampler:
      with self.assertRaises(RuntimeError):
        sampler.start()


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
