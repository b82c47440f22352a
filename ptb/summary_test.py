"""Tests for summary.py: a resumed run's summary describes the whole run."""

import json
import os
import tempfile
import unittest
from unittest import mock

from ptb import monitor
from ptb import summary as summary_lib
from ptb import testing
from ptb.monitor_test import FakeClock


def _epoch(n):
  return {"epoch": n, "valid_perplexity": 100.0 - n}


class SummaryTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.path = os.path.join(tmp.name, "summary.json")

  def _process(self, started, model="test"):
    """The Summary of a process that started at `started` on its clock."""
    clock = FakeClock(now=started)
    return summary_lib.Summary(self.path, ["ptb_word_lm.py", "--model=test"],
                               model, testing.TinyConfig(), ["/cpu:0"],
                               clock=clock), clock

  def _read(self):
    with open(self.path) as f:
      return json.load(f)

  def _publish(self, summary, status, peak_mib):
    with mock.patch.object(summary_lib.monitor, "peak_rss_mib",
                           return_value=peak_mib):
      summary.publish(status)

  def testFirstProcessWritesItsOwnFigures(self):
    summary, clock = self._process(1000.0)
    summary.add_epoch(_epoch(1))
    clock.advance(30.5)
    self._publish(summary, "running", 600.0)
    fields = self._read()
    self.assertEqual(fields["epochs"], [_epoch(1)])
    self.assertEqual(fields["resumes"], [])
    self.assertEqual(fields["status"], "running")
    self.assertEqual(fields["wall_seconds"], 30.5)
    self.assertEqual(fields["peak_rss_mib"], 600.0)
    self.assertEqual(fields["model"], "test")
    self.assertEqual(fields["config"]["hidden_size"], 8)

  def testResumesCarryEpochsWallTimeAndPeak(self):
    first, clock = self._process(1000.0)
    for n in (1, 2, 3):
      first.add_epoch(_epoch(n))
    clock.advance(100.0)
    self._publish(first, "running", 900.0)   # then killed

    # The checkpoint had finished two epochs and 40 steps of the third:
    # epoch 3 of the killed process is not carried, it is trained again.
    second, clock = self._process(5000.0)
    second.resume(2, 40, {"learning_rate": {"from": 1.0, "to": 0.5}})
    second.add_epoch(dict(_epoch(3), valid_perplexity=1.5))
    clock.advance(20.0)
    self._publish(second, "interrupted", 500.0)
    fields = self._read()
    self.assertEqual(fields["epochs"], [_epoch(1), _epoch(2),
                                        dict(_epoch(3), valid_perplexity=1.5)])
    lower_rate = {"learning_rate": {"from": 1.0, "to": 0.5}}
    self.assertEqual(fields["resumes"],
                     [{"epoch": 3, "step": 40, "wall_seconds": 100.0,
                       "config_changes": lower_rate}])
    self.assertEqual(fields["wall_seconds"], 120.0)
    self.assertEqual(fields["peak_rss_mib"], 900.0)   # the first process's

    third, clock = self._process(9000.0)
    third.resume(3, 0, {})
    third.fields["test_perplexity"] = 2.0
    clock.advance(5.0)
    self._publish(third, "finished", 950.0)
    fields = self._read()
    self.assertEqual([e["epoch"] for e in fields["epochs"]], [1, 2, 3])
    self.assertEqual(fields["resumes"],
                     [{"epoch": 3, "step": 40, "wall_seconds": 100.0,
                       "config_changes": lower_rate},
                      {"epoch": 4, "step": 0, "wall_seconds": 120.0,
                       "config_changes": {}}])
    self.assertEqual(fields["wall_seconds"], 125.0)
    self.assertEqual(fields["peak_rss_mib"], 950.0)
    self.assertEqual((fields["status"], fields["test_perplexity"]),
                     ("finished", 2.0))

  def _write_earlier(self, epochs, model="test"):
    """The summary of a killed first process that finished `epochs`."""
    first, _ = self._process(0.0, model=model)
    for n in epochs:
      first.add_epoch(_epoch(n))
    self._publish(first, "running", 1.0)

  def _resume(self, epochs_done):
    """A second process resumes; returns it and its warnings."""
    second, _ = self._process(0.0)
    with mock.patch.object(summary_lib, "warn") as warn:
      second.resume(epochs_done, 0)
    return second, [call.args[0] for call in warn.call_args_list]

  def testMissingEpochsAreReported(self):
    self._write_earlier([1, 3])
    second, warnings = self._resume(3)
    self.assertEqual(warnings, [
        "the summary %s holds 2 of the 3 epochs finished before this resume; "
        "the others stay missing from it" % self.path])
    self.assertEqual(second.fields["epochs"], [_epoch(1), _epoch(3)])

  def testAnUnreadableOrForeignSummaryIsReplaced(self):
    with open(self.path, "w") as f:
      f.write('{"model": "test", "epochs": [')   # cut short
    second, warnings = self._resume(2)
    self.assertEqual(len(warnings), 1)
    self.assertRegex(warnings[0],
                     r"^the summary .* cannot be read \(.*\); this process "
                     r"writes a new one, without the epochs before the resume$")
    # This resume is recorded, without the earlier processes' time.
    self.assertEqual((second.fields["epochs"], second.fields["resumes"]),
                     ([], [{"epoch": 3, "step": 0, "wall_seconds": 0.0,
                            "config_changes": None}]))

    self._write_earlier([1], model="small")
    second, warnings = self._resume(1)
    self.assertEqual(warnings, [
        "the summary %s is not of a test run (it has model 'small'); this "
        "process replaces it" % self.path])
    self.assertEqual(second.fields["epochs"], [])

  def testAFailedWriteKeepsTheLastVersionAndSaysWhy(self):
    summary, _ = self._process(0.0)
    self._publish(summary, "running", 1.0)
    real_mkstemp = tempfile.mkstemp

    def mkstemp_on_a_full_disk(**kwargs):
      """A temporary file whose writes fail with ENOSPC (/dev/full's)."""
      fd, path = real_mkstemp(**kwargs)
      os.close(fd)
      return os.open("/dev/full", os.O_WRONLY), path

    for status, said in (
        ("running", "could not be written (No space left on device); the "
         "file keeps its last complete version, and the next epoch or "
         "checkpoint writes it again"),
        ("finished", "could not be finished (No space left on device): it "
         "keeps its last complete version, whose status is still running; "
         "the next run on this --save_path records it as interrupted")):
      with mock.patch.object(summary_lib.monitor.tempfile, "mkstemp",
                             mkstemp_on_a_full_disk), \
          mock.patch.object(summary_lib, "warn") as warn:
        self._publish(summary, status, 1.0)
      warn.assert_called_once_with("the summary %s %s" % (self.path, said))
      self.assertEqual(self._read()["status"], "running")
      self.assertEqual(os.listdir(os.path.dirname(self.path)),
                       ["summary.json"])

  def testAResumeRecordsAStaleRunningStatusAsInterruptedAtOnce(self):
    first, _ = self._process(0.0)
    first.add_epoch(_epoch(1))
    self._publish(first, "running", 1.0)   # then killed
    second, _ = self._process(50.0)
    second.resume(1, 0)
    fields = self._read()
    self.assertEqual(fields["status"], "interrupted")
    self.assertEqual(fields["epochs"], [_epoch(1)])
    # A status that the earlier process recorded stays as it was.
    self._publish(second, "failed", 1.0)
    third, _ = self._process(90.0)
    third.resume(1, 0)
    self.assertEqual(self._read()["status"], "failed")

  def testNoPathWritesNothing(self):
    with mock.patch.object(monitor, "write_json_atomic") as write:
      summary = summary_lib.Summary(None, [], "test", testing.TinyConfig(),
                                    [])
      summary.resume(1, 0)
      summary.publish("finished")
    write.assert_not_called()


if __name__ == "__main__":
  unittest.main()
