"""Learning curves of ptb_word_lm.py and a peer implementation, side by side.

Runs ptb_word_lm.py, then the peer (by default torch_peer.py, beside this
script: the same model in PyTorch, and torch is not a requirement of this
project; --peer names another), on the same config and data, one after the
other, and prints their perplexities and ratios, per epoch (--epochs=N) or
at the progress lines of the first part of epoch 1 (--fraction=F: both stop
once they have printed the line at F):

  python compare_curves.py --model=medium --epochs=2 --peer_python=python3

The random draws differ between the two, so the peer's curve is a
reference, not an exact target: the ratios show whether this port learns
as an independent implementation of the same model does.

Before either runs, the flags, the corpus's directory and the peer are
checked: `PEER_PYTHON PEER --help` must succeed, so that a peer that cannot
start is not found only after this port's run.
"""

import os
import shutil
import subprocess
import sys

from absl import flags

from ptb import config as config_lib
from ptb import curves
from ptb import data as data_lib
from ptb import errors
from ptb.errors import UserError

_HERE = os.path.dirname(os.path.abspath(__file__))

flags.DEFINE_string("data_path", None,
                    "PTB directory; unset, found as ptb_word_lm.py finds it.")
flags.DEFINE_string("model", "medium", "small, medium or large.")
flags.DEFINE_integer("epochs", 0, "Epochs to train and compare.")
flags.DEFINE_float("fraction", 0.0,
                   "Instead of --epochs: compare the progress lines of epoch "
                   "1 up to this fraction of it.")
flags.DEFINE_integer("seed", 1, "Seed of both runs.")
# The project's own peer is the default, found beside this script from any
# working directory.
flags.DEFINE_string("peer", os.path.join(_HERE, "torch_peer.py"),
                    "The peer's script; by default this project's "
                    "torch_peer.py.")
flags.DEFINE_string("peer_python", "python3",
                    "The interpreter that has the peer's framework.")
FLAGS = flags.FLAGS

_SCRIPT = os.path.join(_HERE, "ptb_word_lm.py")
# The numeric flags' ranges (see config.FLAG_RANGES). The seed is the
# peer's too, and torch takes seeds below 2**64.
_FLAG_RANGES = {"epochs": (0, True), "fraction": (0, True, 1),
                "seed": (0, True, 2**64 - 1)}


def table(ours, peer, fraction):
  """The comparison's lines: one per epoch or per progress line."""
  rows = []
  if fraction:
    rows.append("| fraction of epoch 1 | ours train | peer train | ratio |")
    rows.append("|---|---|---|---|")
    for key in sorted(k for k in ours if k[0] == "progress" and k in peer):
      rows.append("| %s | %.3f | %.3f | %.3f |" % (
          key[1], ours[key], peer[key], ours[key] / peer[key]))
    return rows
  rows.append("| epoch | ours train | peer train | ratio | ours valid | "
              "peer valid | ratio |")
  rows.append("|---|---|---|---|---|---|---|")
  for epoch in sorted({k[1] for k in ours if k[0] == "train"}):
    cells = []
    for what in ("train", "valid"):
      a, b = ours.get((what, epoch)), peer.get((what, epoch))
      cells.append("%s | %s | %s" % (
          "%.3f" % a if a else "-", "%.3f" % b if b else "-",
          "%.3f" % (a / b) if a and b else "-"))
    rows.append("| %d | %s |" % (epoch, " | ".join(cells)))
  return rows


def check_peer(peer, python):
  """Refuses a peer that cannot start, before anything runs.

  The peer runs after ptb_word_lm.py, which may train for hours: a peer
  found missing or broken only then would cost them. `python peer --help`
  proves that the interpreter, the script and its imports (its framework)
  are there.

  Args:
    peer: the --peer script.
    python: the --peer_python interpreter.
  """
  if not os.path.isfile(peer):
    raise UserError("--peer=%s %s" % (peer, "is not a file" if os.path.exists(
        peer) else "does not exist"))
  if not shutil.which(python):
    raise UserError("--peer_python=%s: no such program" % python)
  command = [python, peer, "--help"]
  proc = subprocess.run(command, capture_output=True, text=True,
                        errors="replace", check=False)
  if proc.returncode != 0:
    said = proc.stderr.strip().splitlines() or ["nothing on stderr"]
    raise UserError("the peer does not start: `%s` exited with status %d: %s"
                    % (" ".join(command), proc.returncode, said[-1]))


def main(_):
  config_lib.check_absl_flags(FLAGS, _FLAG_RANGES)
  if bool(FLAGS.epochs > 0) == bool(FLAGS.fraction > 0):
    raise UserError("give one of --epochs=N (N >= 1) and --fraction=F "
                    "(0 < F <= 1)", exit_code=2)
  check_peer(FLAGS.peer, FLAGS.peer_python)
  # The corpus's files are there; what they hold, ptb_word_lm.py checks in
  # its first seconds, before it trains (reading them here would need
  # TensorFlow in this process for the whole comparison).
  data_path = data_lib.resolve(FLAGS.data_path)
  data_lib.corpus_files(data_path)
  epochs = FLAGS.epochs or 1
  ours, ours_seconds = curves.run("ptb_word_lm.py", [
      sys.executable, _SCRIPT, "--data_path=" + data_path,
      "--model=" + FLAGS.model, "--num_gpus=0", "--seed=%d" % FLAGS.seed,
      "--config_overrides=max_max_epoch=%d" % epochs], FLAGS.fraction)
  peer, peer_seconds = curves.run("the peer", [
      FLAGS.peer_python, FLAGS.peer, "--data_path=" + data_path,
      "--model=" + FLAGS.model, "--epochs=%d" % epochs,
      "--seed=%d" % FLAGS.seed], FLAGS.fraction)
  print("%s, %s: ours %.0f s, the peer %.0f s" % (
      FLAGS.model, "%d epochs" % epochs if FLAGS.epochs else
      "first %.2f of epoch 1" % FLAGS.fraction, ours_seconds, peer_seconds))
  print("\n".join(table(ours, peer, FLAGS.fraction)))


if __name__ == "__main__":
  errors.run_main(main, graph_mode=False)
