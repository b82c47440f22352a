"""Tests of compare_curves.py, with a stand-in peer that prints fixed lines."""

import os
import subprocess
import sys
import tempfile

import tensorflow as tf

from ptb import testing

SCRIPT = os.path.join(testing.HERE, "compare_curves.py")

# A peer that prints the tutorial's lines with fixed perplexities; it takes
# (and ignores) the peer's arguments.
FAKE_PEER = '''
import sys
epochs = int([a for a in sys.argv if a.startswith("--epochs=")][0][9:])
for e in range(1, epochs + 1):
  print("Epoch: %d Learning rate: 1.000" % e)
  # The fractions at which --model=test prints on testing.make_corpus.
  for k, f in enumerate(("0.000", "0.085", "0.169", "0.254", "0.339")):
    print("%s perplexity: %.3f speed: 100 wps" % (f, 1000.0 / (k + 1) / e))
  print("Epoch: %d Train Perplexity: %.3f" % (e, 10.0 / e))
  print("Epoch: %d Valid Perplexity: %.3f" % (e, 20.0 / e))
'''


def compare(tmp, *args):
  peer = os.path.join(tmp, "peer.py")
  with open(peer, "w") as f:
    f.write(FAKE_PEER)
  data = testing.make_corpus(tmp)
  return subprocess.run(
      [sys.executable, SCRIPT, "--data_path=" + data, "--model=test",
       "--peer=" + peer, "--peer_python=" + sys.executable] + list(args),
      capture_output=True, text=True, timeout=600, cwd=tmp)


class CompareCurvesTest(tf.test.TestCase):

  def testEpochTableHasBothCurvesAndTheirRatios(self):
    with tempfile.TemporaryDirectory() as tmp:
      proc = compare(tmp, "--epochs=2")
    self.assertEqual(proc.returncode, 0, proc.stderr)
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| ")]
    self.assertEqual(rows[0], "| epoch | ours train | peer train | ratio | "
                     "ours valid | peer valid | ratio |")
    self.assertLen(rows, 3)   # the header, then one row per epoch
    for epoch, row in zip((1, 2), rows[1:]):
      cells = [c.strip() for c in row.strip("|").split("|")]
      self.assertEqual(cells[0], str(epoch))
      ours_train, peer_train, ratio = (float(c) for c in cells[1:4])
      self.assertEqual(peer_train, 10.0 / epoch)
      self.assertAlmostEqual(ratio, ours_train / peer_train, places=3)
      ours_valid, peer_valid, ratio = (float(c) for c in cells[4:7])
      self.assertEqual(peer_valid, 20.0 / epoch)
      self.assertAlmostEqual(ratio, ours_valid / peer_valid, places=3)

  def testFractionTableStopsBothRunsThere(self):
    with tempfile.TemporaryDirectory() as tmp:
      proc = compare(tmp, "--fraction=0.2")
    self.assertEqual(proc.returncode, 0, proc.stderr)
    self.assertIn("first 0.20 of epoch 1", proc.stdout)
    rows = [l for l in proc.stdout.splitlines() if l.startswith("| ")]
    self.assertEqual(rows[0], "| fraction of epoch 1 | ours train | "
                     "peer train | ratio |")
    # Both stopped at their first line past 0.2.
    self.assertEqual([r.split("|")[1].strip() for r in rows[1:]],
                     ["0.000", "0.085", "0.169", "0.254"])
    for k, row in enumerate(rows[1:]):
      ours, peer, ratio = (float(c) for c in row.strip("|").split("|")[1:])
      self.assertAlmostEqual(peer, 1000.0 / (k + 1), places=3)
      self.assertAlmostEqual(ratio, ours / peer, places=3)
    self.assertNotIn("Test Perplexity", proc.stdout)

  def testNeedsEpochsOrFraction(self):
    with tempfile.TemporaryDirectory() as tmp:
      proc = compare(tmp)
    self.assertEqual(proc.returncode, 2)
    self.assertIn("compare_curves.py: error: give one of --epochs", proc.stderr)
    self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  tf.test.main()
