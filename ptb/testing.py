"""Helpers of the tests: generated corpora, tiny configs, the script run.

They run ptb_word_lm.py as a program and never import it (nor the other
top-level modules); the helpers that do are in ptb_word_lm_testing.py.
The last ones run any user script, given its entry point, in this process
or as a program, and check the one line a refused command line ends in.
Nothing here is used by a training run.
"""

import contextlib
import gzip
import io
import os
import subprocess
import sys
from unittest import mock

from absl import flags
from absl.testing import flagsaver
import numpy as np
import tensorflow as tf

from ptb import plan as plan_lib
from ptb.config import BASIC

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(HERE, "ptb_word_lm.py")


def make_corpus(directory, num_words=30, train_lines=300, seed=0,
                word_prefix="w"):
  """Writes a small generated PTB-like corpus; returns the directory."""
  rng = np.random.RandomState(seed)
  words = ["%s%d" % (word_prefix, i) for i in range(num_words)]
  for name, lines in (("train", train_lines), ("valid", 40), ("test", 40)):
    with open(os.path.join(directory, "ptb.%s.txt" % name), "w") as f:
      for _ in range(lines):
        # A skewed distribution, so that a model has something to learn.
        ids = np.minimum(rng.geometric(0.15, size=rng.randint(3, 12)) - 1,
                         num_words - 1)
        f.write(" " + " ".join(words[i] for i in ids) + " \n")
  return directory


def make_gzipped_corpus(directory):
  """make_corpus in `directory` (made here), its training file gzipped.

  A corpus of the wrong kind: its training file is not text.

  Returns:
    The directory.
  """
  os.makedirs(directory)
  train = os.path.join(make_corpus(directory), "ptb.train.txt")
  with open(train, "rb") as f:
    text = f.read()
  with open(train, "wb") as f:
    f.write(gzip.compress(text))
  return directory


def make_structured_corpus(directory, train_lines=1500, num_words=10, seed=0,
                           period=2, length=8):
  """Writes a corpus that only a model carrying its LSTM state can learn.

  Every line repeats `period` words drawn at random (`a b a b a b a b`), so
  each word after the first `period` is the word `period` steps back, and
  is independent of the word just before it: a model that sees only the
  current word (one that loses its state) does no better than the unigram
  model, one that remembers the previous words predicts most of them.
  With `LEARNING_OVERRIDES` on --model=test (2 steps a window), half of
  those dependencies cross from one window to the next.

  Returns:
    The directory.
  """
  rng = np.random.RandomState(seed)
  words = ["s%d" % i for i in range(num_words)]
  for name, lines in (("train", train_lines), ("valid", 200), ("test", 100)):
    with open(os.path.join(directory, "ptb.%s.txt" % name), "w") as f:
      for _ in range(lines):
        ids = np.resize(rng.randint(num_words, size=period), length)
        f.write(" " + " ".join(words[i] for i in ids) + " \n")
  return directory


# --model=test made big enough to learn make_structured_corpus (10 words and
# <eos>) in a few seconds.
LEARNING_OVERRIDES = ("hidden_size=16,vocab_size=11,max_epoch=2,"
                      "max_max_epoch=3,max_grad_norm=5")
# A test perplexity below this shows that the model learned what needs its
# state (the corpus test shows the unigram model and a model that loses its
# state at every step above 9).
LEARNED_TEST_PERPLEXITY = 4.0


def learning_args(data, overrides="", seed=3):
  """ptb_word_lm.py's command line for a run that learns the corpus in `data`.

  --model=test with LEARNING_OVERRIDES, then `overrides`, on the CPU.
  """
  return ["--data_path=" + data, "--model=test", "--num_gpus=0",
          "--seed=%d" % seed, "--config_overrides=" + ",".join(
              filter(None, [LEARNING_OVERRIDES, overrides]))]


def drop_variables(ckpt, names):
  """Rewrites the checkpoint `ckpt` without the variables `names`."""
  values = tf.train.load_checkpoint(ckpt)
  with tf.Graph().as_default():
    kept = [tf.compat.v1.Variable(values.get_tensor(name), name=name)
            for name in values.get_variable_to_shape_map()
            if name not in names]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver(kept).save(session, ckpt, write_state=False,
                                          write_meta_graph=False)
  assert not set(names) & set(tf.train.load_checkpoint(ckpt)
                              .get_variable_to_shape_map())


def run_script(*args, timeout=600, env=None):
  """Runs ptb_word_lm.py; returns (exit code, stdout, stderr)."""
  proc = subprocess.run([sys.executable, SCRIPT] + list(args),
                        capture_output=True, text=True, timeout=timeout,
                        cwd=HERE, env=env)
  return proc.returncode, proc.stdout, proc.stderr


class TinyConfig(object):
  init_scale = 0.1
  learning_rate = 1.0
  max_grad_norm = 5
  num_layers = 2
  num_steps = 5
  hidden_size = 8
  max_epoch = 1
  max_max_epoch = 1
  keep_prob = 1.0
  lr_decay = 0.5
  batch_size = 4
  vocab_size = 30
  rnn_mode = BASIC


def wavefront_limits(chunk, hidden, limits=plan_lib.THRESHOLDS):
  """The plan's thresholds, but a wavefront of `chunk` steps forced.

  Args:
    chunk: the wavefront's steps per chunk; None: one layer at a time.
    hidden: the model's hidden size.
    limits: the other thresholds.
  """
  return limits._replace(wavefront_chunk=chunk or 1,
                         wavefront_below_hidden=hidden + 1 if chunk else 0)


def reference_lstm(x, c, h, kernel, bias):
  """The LSTM in numpy, as docs/model.md describes it: gates (i, j, f, o)."""
  sigmoid = lambda v: 1 / (1 + np.exp(-v))
  outputs = []
  for x_t in x:
    gates = np.concatenate([x_t, h], 1) @ kernel + bias
    i, j, f, o = np.split(gates, 4, axis=1)
    c = sigmoid(f + 0.0) * c + sigmoid(i) * np.tanh(j)
    h = sigmoid(o) * np.tanh(c)
    outputs.append(h)
  return np.stack(outputs), c, h


def unigram_perplexity(train, test):
  """Perplexity on `test` of the word frequencies of `train` (id lists)."""
  counts = np.bincount(train, minlength=max(max(train), max(test)) + 1)
  return float(np.exp(-np.mean(np.log(counts[test[1:]] / len(train)))))


def start_run(args, env=None, progress_lines=1):
  """Starts ptb_word_lm.py; returns once it printed `progress_lines` lines.

  Returns:
    (the Popen with stdout and stderr pipes, the stdout lines read so far).
  """
  proc = subprocess.Popen(
      [sys.executable, SCRIPT] + list(args), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, cwd=HERE,
      env=dict(env or os.environ, PYTHONUNBUFFERED="1"))
  lines, seen = [], 0
  for line in proc.stdout:
    lines.append(line)
    seen += "wps" in line
    if seen == progress_lines:
      break
  return proc, lines


def assert_user_error(test, args, pattern, code=1, env=None):
  """Runs the script; checks exit `code`, one error line, no traceback.

  Returns:
    (stdout, stderr) for further checks.
  """
  exit_code, out, err = run_script(*args, env=env)
  test.assertEqual(exit_code, code, "stdout: %s\nstderr: %s" % (out, err))
  test.assertNotIn("Traceback", err)
  error_lines = [l for l in err.splitlines()
                 if l.startswith("ptb_word_lm.py: error:")]
  test.assertLen(error_lines, 1, err)
  test.assertRegex(error_lines[0], pattern)
  return out, err


def run_entry_point(entry, argv, flag_values=None):
  """Runs a user script's entry point in this process, as its command line.

  Args:
    entry: runs what the script's `__main__` block runs; returns the exit
      status or raises SystemExit.
    argv: the command line, the script's name first.
    flag_values: the script's absl FlagValues where it has its own (absl's
      global ones otherwise): their values are restored afterwards.

  Returns:
    (stdout, stderr, exit status).
  """
  flag_values = flag_values or flags.FLAGS
  saved = flagsaver.save_flag_values(flag_values)
  out, err = io.StringIO(), io.StringIO()
  try:
    with mock.patch.object(sys, "argv", list(argv)), \
        contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        status = entry()
      except SystemExit as e:
        status = e.code
  finally:
    flagsaver.restore_flag_values(saved, flag_values)
  return out.getvalue(), err.getvalue(), status or 0


def run_program(script, args, timeout=600):
  """Runs the user script `script` (a file in HERE) as a program.

  Returns:
    (stdout, stderr, exit status).
  """
  proc = subprocess.run([sys.executable, os.path.join(HERE, script)] +
                        list(args), capture_output=True, text=True,
                        timeout=timeout, cwd=HERE)
  return proc.stdout, proc.stderr, proc.returncode


def assert_each_refused(test, script, cases, run):
  """Checks a table of refused command lines, each case as a subtest.

  Args:
    test: the TestCase.
    script: the script's file name.
    cases: (arguments, what the error line must say, exit status) each.
    run: runs the script on a case's arguments; returns (stdout, stderr,
      exit status), having checked that nothing was done first.
  """
  for args, fragment, code in cases:
    with test.subTest(args=args):
      assert_error_line(test, script, run(args), fragment, code)


def assert_error_line(test, script, result, fragment, exit_code, alone=True):
  """Checks that a run ended as a refused command line does: in one line.

  Args:
    test: the TestCase.
    script: the script's file name, which starts its error line.
    result: (stdout, stderr, exit status) of the run.
    fragment: what the error line must say.
    exit_code: the status the run must end with.
    alone: the line must be all of stderr; otherwise it must be the last
      line and the only one that names the script (a program that imports
      TensorFlow may print TensorFlow's start-up lines first).
  """
  _, err, status = result
  lines = err.splitlines()
  test.assertNotIn("Traceback", err)
  test.assertEqual(status, exit_code, err)
  test.assertTrue(lines and lines[-1].startswith(script + ": error: "), err)
  test.assertIn(fragment, lines[-1])
  mine = lines if alone else [l for l in lines if script in l]
  test.assertEqual(len(mine), 1, err)
