"""Tests for monitor.py."""

import csv
import json
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
