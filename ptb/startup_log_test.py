"""Tests of startup_log.py: TensorFlow's C++ start-up lines and the level."""

import os
import re
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from ptb import startup_log
from ptb import testing

# What importing TensorFlow 2.21 writes on a CPU without CUDA, with oneDNN on.
_START_UP = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796433447.945262   20979 port.cc:153] oneDNN custom operations are on.
I0000 00:00:1796433447.945555   20979 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
W0000 00:00:1796433447.945600   20979 some.cc:7] a warning
E0000 00:00:1796433447.945700   20979 other.cc:9] an error
a line of no log format
"""
# A line of a C++ source file's log, as TensorFlow writes them.
_NATIVE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ \S+\.cc:\d+\] ")


class KeptLinesTest(unittest.TestCase):

  def testEachLevelDropsTheSeveritiesBelowIt(self):
    lines = _START_UP.splitlines(keepends=True)
    self.assertEqual(startup_log.kept_lines(_START_UP, 0), lines)
    self.assertEqual(startup_log.kept_lines(_START_UP, 1), lines[3:])
    self.assertEqual(startup_log.kept_lines(_START_UP, 2), lines[4:])
    self.assertEqual(startup_log.kept_lines(_START_UP, 3), lines[5:])

  def testTheLevelFromTheEnvironment(self):
    for value, level in (("2", 2), (None, 0), ("x", 0)):
      env = dict(os.environ)
      env.pop("TF_CPP_MIN_LOG_LEVEL", None)
      if value is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = value
      with mock.patch.dict(os.environ, env, clear=True):
        self.assertEqual(startup_log.min_log_level(), level)


class RealProcessTest(unittest.TestCase):
  """A plain CPU run's stderr holds the port's lines only."""

  def run_script(self, env):
    with tempfile.TemporaryDirectory() as tmp:
      return subprocess.run(
          [sys.executable, testing.SCRIPT, "--data_path=" +
           testing.make_corpus(tmp), "--model=test", "--num_gpus=0",
           "--config_overrides=vocab_size=31"],
          cwd=testing.HERE, env=env, capture_output=True, text=True,
          timeout=300, check=False)

  def testNoStartUpLineUnlessTheLevelAsksForThem(self):
    env = {k: v for k, v in os.environ.items()
           if k != "TF_CPP_MIN_LOG_LEVEL"}
    plain = self.run_script(env)
    self.assertEqual(plain.returncode, 0, plain.stderr)
    self.assertIn("Test Perplexity: ", plain.stdout)
    native = [l for l in plain.stderr.splitlines()
              if _NATIVE.match(l) or "absl::InitializeLog" in l]
    self.assertEqual(native, [])
    shown = self.run_script(dict(env, TF_CPP_MIN_LOG_LEVEL="0"))
    self.assertEqual(shown.returncode, 0, shown.stderr)
    self.assertIn("absl::InitializeLog", shown.stderr)
    self.assertTrue(any(_NATIVE.match(l) for l in shown.stderr.splitlines()),
                    shown.stderr)


if __name__ == "__main__":
  unittest.main()
