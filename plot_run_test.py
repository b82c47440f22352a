"""Tests for plot_run.py."""

import csv
import functools
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import matplotlib.image
import numpy as np

from ptb import monitor
from ptb import testing
import plot_run

_PLOT_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "plot_run.py")
_PNG_SIGNATURE = b"\x89PNG"
# plot_run's figure in pixels (11 x 9 inches at 120 dpi), rows x columns.
_PNG_SHAPE = (1080, 1320)
# Each panel's data, by its colour in plot_run.py: the region of the figure
# it must appear in (fractions of height and width) and the pixels of that
# colour it draws at least there (a legend's sample alone draws fewer).
_PANEL_INK = {
    "memory": ("#08306b", (0.0, 0.55, 0.0, 1.0), 1000),
    "speed": ("#6baed6", (0.5, 1.0, 0.0, 0.5), 10000),
    "train perplexity": ("#2171b5", (0.5, 1.0, 0.5, 1.0), 300),
    "valid perplexity": ("#e6550d", (0.5, 1.0, 0.5, 1.0), 300),
}


def synthetic_summary(num_epochs=3):
  """A finished run's summary, shaped as ptb_word_lm.py writes it."""
  epochs = []
  for i in range(num_epochs):
    epochs.append({
        "epoch": i + 1,
        "learning_rate": 1.0 if i < 2 else 0.5,
        "train_perplexity": 270.1 / (1.6 ** i),
        "valid_perplexity": 180.4 / (1.3 ** i),
        "train_wps": 6100.0 + 150.0 * i,
        "train_seconds": 150.2,
        "valid_seconds": 2.1,
    })
  return {
      "command": ["ptb_word_lm.py", "--model=small"],
      "status": "finished",
      "model": "small",
      "rnn_mode": "BASIC",
      "config": {"batch_size": 20, "hidden_size": 200},
      "tensorflow_version": "2.21.0",
      "python_version": "3.11.7",
      "devices": ["/cpu:0"],
      "epochs": epochs,
      "test_perplexity": 115.2,
      "wall_seconds": 480.5,
      "peak_rss_mib": 812.3,
  }


def synthetic_memory_rows(num_epochs=3, gpu=False):
  """Memory rows as MemorySampler writes them (all values strings)."""
  rows = []
  t = 0.0

  def add(phase, epoch, count, rss_start, rss_end):
    nonlocal t
    for k in range(count):
      rss = rss_start + (rss_end - rss_start) * k / max(count - 1, 1)
      row = {"seconds": "%.3f" % t, "rss_mib": "%.1f" % rss, "phase": phase,
             "epoch": str(epoch), "step": str(k * 10)}
      if gpu:
        row["gpu0_bytes_in_use"] = str(int(rss * 0.5 * 1024 * 1024))
        row["gpu0_peak_bytes"] = str(int(rss * 0.6 * 1024 * 1024))
      rows.append(row)
      t += 2.0

  add("startup", 0, 8, 150.0, 620.0)
  for epoch in range(1, num_epochs + 1):
    add("train", epoch, 30, 700.0, 790.0 + 5 * epoch)
    add("valid", epoch, 3, 760.0, 770.0)
  add("test", num_epochs, 3, 770.0, 760.0)
  return rows


def _write_csv(path, rows):
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


def _run_tool(*args):
  return subprocess.run([sys.executable, _PLOT_RUN] + list(args),
                        capture_output=True, text=True, timeout=120,
                        check=False)


def _ink(image, color, region):
  """Pixels of `image` [H, W, 3] in `region` within 0.06 of `color`."""
  rgb = np.array([int(color[i:i + 2], 16) / 255.0 for i in (1, 3, 5)])
  height, width = image.shape[:2]
  y0, y1, x0, x1 = region
  part = image[int(y0 * height):int(y1 * height),
               int(x0 * width):int(x1 * width)]
  return int((np.abs(part - rgb).max(axis=-1) < 0.06).sum())


_ALL = tuple(_PANEL_INK)


class PlotRunTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self._tmp = tempfile.TemporaryDirectory()
    self.addCleanup(self._tmp.cleanup)

  def _path(self, name):
    return os.path.join(self._tmp.name, name)

  def assertIsPng(self, path, drawn=(), blank=()):
    """A PNG of plot_run's size whose panels `drawn` show their data.

    Args:
      path: the PNG.
      drawn: names in _PANEL_INK that must show their data.
      blank: names in _PANEL_INK that must show none.
    """
    self.assertTrue(os.path.exists(path), path)
    with open(path, "rb") as f:
      self.assertEqual(f.read(4), _PNG_SIGNATURE)
    image = matplotlib.image.imread(path)[..., :3]
    self.assertEqual(image.shape[:2], _PNG_SHAPE)
    for name in list(drawn) + list(blank):
      pixels = _ink(image, *_PANEL_INK[name][:2])
      if name in drawn:
        self.assertGreater(pixels, _PANEL_INK[name][2], name)
      else:
        self.assertEqual(pixels, 0, name)

  def testPlotRunWritesPng(self):
    output = self._path("run.png")
    result = plot_run.plot_run(synthetic_summary(), synthetic_memory_rows(),
                               output)
    self.assertEqual(result, output)
    self.assertIsPng(output, drawn=_ALL)

  def testPanelsWithoutTheirData(self):
    output = self._path("parts.png")
    plot_run.plot_run(synthetic_summary(), None, output)
    self.assertIsPng(output, drawn=_ALL[1:], blank=_ALL[:1])
    summary = synthetic_summary()
    summary["epochs"] = []
    plot_run.plot_run(summary, synthetic_memory_rows(), output)
    self.assertIsPng(output, drawn=_ALL[:1], blank=_ALL[1:])

  def testPlotRunWithGpuColumns(self):
    output = self._path("gpu.png")
    plot_run.plot_run(synthetic_summary(), synthetic_memory_rows(gpu=True),
                      output)
    self.assertIsPng(output, drawn=_ALL)

  def testEpochsResumedPartWayAreDrawnApart(self):
    summary = synthetic_summary()
    summary["resumes"] = [{"epoch": 2, "step": 140}, {"epoch": 3, "step": 0},
                          "not a resume"]
    self.assertEqual(plot_run._resumed_part_way(summary), {2})  # pylint: disable=protected-access
    speed_region = _PANEL_INK["speed"][1]
    for resumes, part_way in ((summary["resumes"], True), ([], False)):
      summary["resumes"] = resumes
      output = self._path("resumed.png")
      plot_run.plot_run(summary, synthetic_memory_rows(), output)
      image = matplotlib.image.imread(output)[..., :3]
      light = _ink(image, plot_run._PART_WAY_COLOR, speed_region)  # pylint: disable=protected-access
      with self.subTest(part_way=part_way):
        if part_way:  # one bar of three, hatched
          self.assertGreater(light, 2000)
          self.assertGreater(_ink(image, *_PANEL_INK["speed"][:2]),
                             _PANEL_INK["speed"][2])
        else:
          self.assertEqual(light, 0)

  def testPlotRunOfKilledRun(self):
    summary = {"status": "interrupted", "model": "small", "epochs": []}
    output = self._path("killed.png")
    plot_run.plot_run(summary, None, output)
    self.assertIsPng(output, blank=_ALL)

  def testPhaseSpans(self):
    spans = plot_run._phase_spans(  # pylint: disable=protected-access
        [0.0, 1.0, 2.0, 3.0, 4.0], ["startup", "train", "train", "valid",
                                    "valid"])
    self.assertEqual(spans, [("startup", 0.0, 1.0), ("train", 1.0, 3.0),
                             ("valid", 3.0, 4.0)])

  def testResumeTimesAreTheLaterStartups(self):
    times = [0.0, 2.0, 5.0, 7.0, 9.0, 11.0, 12.0]
    phases = ["startup", "train", "valid", "startup", "train", "startup",
              "test"]
    spans = plot_run._phase_spans(times, phases)  # pylint: disable=protected-access
    resume_times = plot_run._resume_times  # pylint: disable=protected-access
    self.assertEqual(resume_times(spans), [7.0, 11.0])
    self.assertEqual(resume_times(spans[:3]), [])

  def testLoadMemoryCsvSkipsCutLastLine(self):
    path = self._path("memory.csv")
    _write_csv(path, synthetic_memory_rows())
    with open(path, "a") as f:
      f.write("961.0")  # a run killed while writing a row
    rows = plot_run.load_memory_csv(path)
    self.assertEqual(len(rows), len(synthetic_memory_rows()))

  def testCommandLineWithSamplerCsv(self):
    summary_path = self._path("summary.json")
    csv_path = self._path("memory.csv")
    output = self._path("cli.png")
    monitor.write_json_atomic(summary_path, synthetic_summary())
    # A real MemorySampler file, then the synthetic rows in its format.
    with monitor.MemorySampler(csv_path, interval=60.0) as sampler:
      sampler.set_phase("train", 1, 5)
    with open(csv_path, newline="") as f:
      header = next(csv.reader(f))
    self.assertEqual(header, list(synthetic_memory_rows()[0]))
    _write_csv(csv_path, synthetic_memory_rows())

    result = _run_tool("--summary_json=" + summary_path,
                       "--memory_csv=" + csv_path, "--output=" + output)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIsPng(output, drawn=_ALL)

  def _write(self, name, content):
    """Writes `content` (bytes, or text) to the test's file `name`."""
    path = self._path(name)
    with open(path, "wb") as f:
      f.write(content if isinstance(content, bytes) else content.encode())
    return path

  def _run(self, args):
    """plot_run.py's entry point on `args`; the drawing fails if reached."""
    argv = ["plot_run.py"] + args
    with mock.patch.object(plot_run, "plot_run") as draw:
      result = testing.run_entry_point(functools.partial(plot_run.run, argv),
                                       argv, plot_run.FLAGS)
    self.assertFalse(draw.called, "drawn first")
    return result

  def testBadFlagsAndInputsEndInOneLineBeforeAnyDrawing(self):
    summary = self._write("summary.json", json.dumps(synthetic_summary()))
    memory = self._path("memory.csv")
    _write_csv(memory, synthetic_memory_rows())
    png = self._path("run.png")
    # Inputs of the wrong kind: compressed, cut short, another program's.
    gzipped = self._write("summary.json.gz",
                          gzip.compress(json.dumps(synthetic_summary())
                                        .encode()))
    cut = self._write("cut.json", '{"status": "runn')
    benchmark_json = self._write("bench.json", json.dumps(
        {"tensorflow": "2.21.0", "results": []}))
    a_list = self._write("list.json", "[1, 2]")
    csv_gzipped = self._write("memory.csv.gz", gzip.compress(b"seconds,rss"))
    other_csv = self._write("other.csv", "name,size\na,1\n")
    in_the_way = self._write("in_the_way", "a file\n")
    cases = [
        ([], "Flag --summary_json must have a value other than None", 2),
        (["--summary_json=" + summary], "Flag --output must have a value", 2),
        (["--summary_json=" + summary, "--output=" + png, "--dpi=300"],
         "Unknown command line flag 'dpi'", 2),
        (["--summary_json=" + summary, "--output=" + png, "extra"],
         "unexpected arguments: extra", 2),
        (["--summary_json=" + self._path("missing.json"), "--output=" + png],
         "cannot read summary JSON", 1),
        (["--summary_json=" + gzipped, "--output=" + png],
         "is not text (compressed?)", 1),
        (["--summary_json=" + cut, "--output=" + png], "is not valid JSON", 1),
        (["--summary_json=" + benchmark_json, "--output=" + png],
         "is not a run summary of ptb_word_lm.py", 1),
        (["--summary_json=" + a_list, "--output=" + png],
         "is not a run summary of ptb_word_lm.py", 1),
        (["--summary_json=" + summary, "--memory_csv=" + csv_gzipped,
          "--output=" + png], "memory CSV %s is not text" % csv_gzipped, 1),
        (["--summary_json=" + summary, "--memory_csv=" + other_csv,
          "--output=" + png], "lacks seconds,rss_mib columns", 1),
        (["--summary_json=" + summary, "--memory_csv=" + self._path("none"),
          "--output=" + png], "cannot read memory CSV", 1),
        (["--summary_json=" + summary, "--output=" + self._tmp.name],
         "is a directory; give a file name", 1),
        (["--summary_json=" + summary,
          "--output=" + os.path.join(in_the_way, "run.png")],
         "cannot be written: Not a directory", 1),
        (["--summary_json=" + summary, "--memory_csv=" + memory,
          "--output=" + self._path("run.txt")],
         "matplotlib writes no .txt files", 2),
    ]
    testing.assert_each_refused(self, "plot_run.py", cases, self._run)
    self.assertFalse(os.path.exists(png))
    # One as a program: the real entry point.
    testing.assert_error_line(
        self, "plot_run.py", testing.run_program(
            "plot_run.py", ["--summary_json=" + gzipped, "--output=" + png]),
        "is not text (compressed?)", 1)


if __name__ == "__main__":
  unittest.main()
