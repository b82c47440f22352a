"""Tests of compare_curves.py, with a stand-in peer that prints fixed lines."""

import functools
import gzip
import os
import signal
import subprocess
import sys
import tempfile

import tensorflow as tf

from ptb import curves
from ptb import testing

SCRIPT = os.path.join(testing.HERE, "compare_curves.py")

# A peer that prints the tutorial's lines with fixed perplexities; it takes
# (and ignores) the peer's arguments, and starts with --help as peers do.
FAKE_PEER = '''
import sys
if "--help" in sys.argv:
  sys.exit(0)
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


# A program that prints a progress line, then waits; on SIGINT it writes
# the file named by its argument (as the original's Supervisor closes its
# event files) and exits.
INTERRUPTED = '''
import signal, sys, time
def done(*_):
  open(sys.argv[1], "w").write("closed")
  sys.exit(1)
signal.signal(signal.SIGINT, done)
print("Epoch: 1 Learning rate: 1.000")
print("0.004 perplexity: 4952.398 speed: 2662 wps", flush=True)
time.sleep(60)
'''


class CurvesRunTest(tf.test.TestCase):

  def testStopsAtTheFractionWithTheSignalGiven(self):
    with tempfile.TemporaryDirectory() as tmp:
      program, closed = (os.path.join(tmp, n) for n in ("p.py", "closed"))
      with open(program, "w") as f:
        f.write(INTERRUPTED)
      found, seconds = curves.run("p", [sys.executable, program, closed],
                                  0.001, stop=signal.SIGINT)
      self.assertEqual(found[("progress", "0.004")], 4952.398)
      self.assertLess(seconds, 30)
      with open(closed) as f:
        self.assertEqual(f.read(), "closed")


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

  def testThePeerIsThisProjectsTorchPeerByDefault(self):
    # Found beside the script from any working directory: from a temporary
    # one, the check of the default peer passes, and the next one (the
    # interpreter's) refuses.
    with tempfile.TemporaryDirectory() as tmp:
      run = functools.partial(subprocess.run, capture_output=True, text=True,
                              timeout=600, cwd=tmp)
      helped = run([sys.executable, SCRIPT, "--help"])
      refused = run([sys.executable, SCRIPT, "--epochs=1",
                     "--peer_python=no-such-python"])
    default = "(default: '%s')" % os.path.join(testing.HERE, "torch_peer.py")
    # absl wraps the help's lines, and may break a long path anywhere.
    self.assertIn("".join(default.split()), "".join(helped.stdout.split()))
    self.assertEqual(refused.returncode, 1, refused.stderr)
    self.assertIn("--peer_python=no-such-python: no such program",
                  refused.stderr)

  def testBadFlagsAndInputsEndInOneLineBeforeAnythingRuns(self):
    # Each case is a process: this script's flags (--data_path, --model,
    # --seed) are absl's global ones, as ptb_word_lm.py's are, and the two
    # cannot be defined in one test process. The processes are short: the
    # script imports no TensorFlow.
    with tempfile.TemporaryDirectory() as tmp:
      no_valid = os.path.join(tmp, "no_valid")
      os.mkdir(no_valid)
      os.remove(os.path.join(testing.make_corpus(no_valid), "ptb.valid.txt"))
      broken = os.path.join(tmp, "broken_peer.py")
      with open(broken, "w") as f:
        f.write("import no_such_framework\n")
      gzipped = os.path.join(tmp, "gzipped_peer.py")
      with open(gzipped, "wb") as f:
        f.write(gzip.compress(FAKE_PEER.encode()))

      def run(args):
        """compare_curves.py on `args`; nothing ran: stdout is empty."""
        proc = compare(tmp, *args)
        self.assertEqual(proc.stdout, "")
        return proc.stdout, proc.stderr, proc.returncode

      # One error line and nothing else on stderr: no "Running ..." line.
      testing.assert_each_refused(self, "compare_curves.py", [
          ([], "give one of --epochs", 2),
          (["--epochs=1", "--fraction=0.5"], "give one of --epochs", 2),
          (["--epochs=-1"], "--epochs=-1 must be 0 or more", 2),
          (["--fraction=1.5"], "--fraction=1.5 must be at most 1", 2),
          (["--fraction=nan"], "--fraction=nan must be 0 or more", 2),
          (["--epochs=1", "--seed=-3"], "--seed=-3 must be 0 or more", 2),
          (["--epochs=1", "--seed=%d" % 2**64], "must be at most", 2),
          (["--epochs=two"], "flag --epochs=two: invalid literal", 2),
          (["--epochs=1", "--peer=" + os.path.join(tmp, "none.py")],
           "none.py does not exist", 1),
          (["--epochs=1", "--peer=" + tmp], "is not a file", 1),
          (["--epochs=1", "--peer_python=no-such-python"],
           "--peer_python=no-such-python: no such program", 1),
          (["--epochs=1", "--peer=" + broken],
           "the peer does not start: `%s %s --help` exited with status 1: "
           "ModuleNotFoundError: No module named 'no_such_framework'"
           % (sys.executable, broken), 1),
          (["--epochs=1", "--peer=" + gzipped], "the peer does not start", 1),
          (["--epochs=1", "--data_path=" + os.path.join(tmp, "nowhere")],
           "nowhere does not exist", 1),
          (["--epochs=1", "--data_path=" + no_valid],
           "ptb.valid.txt is missing", 1),
      ], run)


if __name__ == "__main__":
  tf.test.main()
