"""Tests of compare_original.py and ptb/original_run.py, and the port against
the 2018 original on TensorFlow 1.5.1 where its virtualenv exists.

The original's tests need its three files ($PTB_ORIGINAL_DIR, else
../shared/original beside this checkout) and a virtualenv with TensorFlow
1.5.1 ($PTB_ORIGINAL_VENV, else compare_original.py's default), which
.ci/run makes with ../shared/original/setup.sh where a Python 3.6 exists;
elsewhere they skip, saying which is missing.
"""

import glob
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

import compare_original
import ptb_word_lm_testing
from ptb import errors
from ptb import kernels_test
from ptb import original_checkpoint
from ptb import original_norm
from ptb import original_run
from ptb import testing

ORIGINAL_DIR = os.environ.get("PTB_ORIGINAL_DIR") or os.path.join(
    os.path.dirname(testing.HERE), "shared", "original")
ORIGINAL_VENV = os.environ.get("PTB_ORIGINAL_VENV") or os.path.join(
    compare_original.data_lib.cache_root(), "venv-original")
# A config that exercises what the two must share: two layers, clipping at
# every step (max_grad_norm 1), the decay after epoch 1, the state carried
# through validation and test; a learning rate that learns the corpus
# (see _corpus) without racing to certainty, where float32's rounding
# grows.
OVERRIDES = ("num_layers=2,hidden_size=8,num_steps=5,batch_size=4,"
             "learning_rate=0.2")
_ROW = re.compile(r"^\| (.+?) \| (\S+) \| (\S+) \| (\S+) \|$")


def _corpus(directory):
  """A corpus on which the original's summary thread changes nothing.

  The thread takes a training and a validation window as the session
  opens, while the first steps run: which window it takes depends on the
  threads' timing. Here every window of a row holds the same words (each
  line is four words and its end: one window of OVERRIDES' 5 steps), the
  rows starting at different words (a row's length is no multiple of 5),
  so no take can change what a pass sees. The test file, which no summary
  reads, varies.
  """
  rng = np.random.RandomState(0)
  words = ["w1", "w2", "w3", "w4"]
  line = " " + " ".join(words) + " \n"
  for name, lines in (("train", 481), ("valid", 101)):
    with open(os.path.join(directory, "ptb.%s.txt" % name), "w") as f:
      f.write(line * lines)
  with open(os.path.join(directory, "ptb.test.txt"), "w") as f:
    for _ in range(60):
      f.write(" " + " ".join(rng.choice(words, rng.randint(2, 9))) + " \n")
  return directory


def _why_no_original():
  """Why the original cannot run here, or None if it can."""
  if not os.path.isfile(os.path.join(ORIGINAL_DIR, "ptb_word_lm.py")):
    return "no original at %s (set PTB_ORIGINAL_DIR)" % ORIGINAL_DIR
  if not original_run.has_tensorflow(ORIGINAL_VENV):
    return ("no TensorFlow 1.5.1 virtualenv at %s: .ci/run makes it with "
            "../shared/original/setup.sh where a Python 3.6 exists (set "
            "PTB_ORIGINAL_VENV)" % ORIGINAL_VENV)
  return None


def _compare(*args):
  """compare_original.py's main in this process; (stdout, stderr, status)."""
  return testing.run_entry_point(
      lambda: errors.run_main(compare_original.main, graph_mode=False),
      ["compare_original.py"] + list(args))


class RefusalTest(tf.test.TestCase):

  def testBadInputEndsInOneLineBeforeAnyWork(self):
    with tempfile.TemporaryDirectory() as tmp:
      venv = os.path.join(tmp, "venv")
      data = testing.make_corpus(tmp)
      empty = os.path.join(tmp, "empty")
      os.mkdir(empty)
      original = ["--original=" + ORIGINAL_DIR, "--original_venv=" + venv,
                  "--data_path=" + data, "--model=test"]

      def run(args):
        result = _compare(*args)
        self.assertEqual(result[0], "")  # nothing ran
        self.assertFalse(os.path.exists(venv))
        return result

      testing.assert_each_refused(self, "compare_original.py", [
          (original, "give one of --epochs", 2),
          (original + ["--epochs=1", "--fraction=0.5"], "give one of", 2),
          (original + ["--fraction=2"], "--fraction=2.0 must be at most 1", 2),
          (original[1:] + ["--epochs=1"], "give --original=DIR", 2),
          (["--original=" + empty] + original[1:] + ["--epochs=1"],
           "no ptb_word_lm.py or reader.py or util.py there", 2),
          (original + ["--epochs=1", "--num_gpus=2"],
           "--num_gpus: the comparison runs both programs as the original "
           "ran on the CPU", 2),
          (original + ["--epochs=1", "--rnn_mode=block"], "--rnn_mode:", 2),
          (original + ["--epochs=1", "--use_bf16"], "--use_bf16:", 2),
          (original + ["--epochs=1", "--config_overrides=rnn_mode=cudnn"],
           "rnn_mode=cudnn cannot be compared", 2),
          (original + ["--epochs=1", "--config_overrides=max_max_epoch=3"],
           "give the epochs as --epochs", 2),
          (original + ["--epochs=1", "--config_overrides=keep_prob=2"],
           "keep_prob", 2),
          (original + ["--epochs=1", "--model=huge"], "Invalid model: huge",
           2),
          (original + ["--epochs=1", "--data_path=" + empty],
           "ptb.train.txt is missing", 1),
      ], run)

  def testTheClassIsEditedInPlaceAndNothingElse(self):
    source = ("class LargeConfig(object):\n  max_epoch = 14\n"
              "  lr_decay = 1 / 1.15\n\n\nclass TestConfig(object):\n"
              "  max_epoch = 1\n")
    edited = original_run.edit_class(source, "LargeConfig",
                                     {"max_epoch": 4, "lr_decay": 0.5})
    self.assertEqual(edited, source.replace("14", "4").replace("1 / 1.15",
                                                                "0.5"))
    with self.assertRaisesRegex(errors.UserError, "LargeConfig has no field "
                                "hidden"):
      original_run.edit_class(source, "LargeConfig", {"hidden": 1})

  def testEditsAreTheFieldsThatDiffer(self):
    if not os.path.isdir(ORIGINAL_DIR):
      self.skipTest("no original at %s" % ORIGINAL_DIR)
    fields = compare_original.original_fields(ORIGINAL_DIR, "large")
    self.assertEqual(fields["lr_decay"], 1 / 1.15)
    self.assertNotIn("rnn_mode", fields)
    config = compare_original.port_config("large", "keep_prob=1")
    self.assertEqual(compare_original.edits(config, fields, 10),
                     {"keep_prob": 1, "max_max_epoch": 10})


class SharedWeightsTest(tf.test.TestCase):
  """Both programs start from the same weights, however long the original
  runs."""

  def testThePortsWeightsOutliveTheOriginalsSaves(self):
    lines = {("progress", "0.004"): 900.0, ("speed", "0.004"): 100.0,
             ("train", 1): 500.0, ("valid", 1): 400.0, ("test",): 390.0}
    given = {}

    def run(name, command, fraction, **unused_kwargs):
      del fraction
      if name == "the original":
        # An hour of it: its Saver, keeping its 5 newest saves, has
        # deleted the checkpoint it restored from its --save_path.
        save_path = command[-1].split("=", 1)[1]
        for path in glob.glob(os.path.join(save_path, "model.ckpt-0.*")):
          os.remove(path)
      else:
        init = [a for a in command if a.startswith("--init_from=")]
        given["port"] = original_checkpoint.read(init[0].split("=", 1)[1])
      return dict(lines), 1.0

    with tempfile.TemporaryDirectory() as tmp, \
        mock.patch.object(compare_original.curves, "run", run), \
        mock.patch.object(original_run, "ensure_venv", lambda venv: "python"):
      out, err, status = _compare(
          "--original=" + ORIGINAL_DIR, "--original_venv=" + tmp,
          "--data_path=" + testing.make_corpus(tmp), "--model=test",
          "--epochs=1")
    self.assertEqual(status, 0, err)
    self.assertIn("| test | 390.000 | 390.000 | 1.00000 |", out)
    expected = original_checkpoint.initial_values(
        compare_original.port_config("test", None), 1)
    self.assertCountEqual(given["port"], expected)
    for name, value in expected.items():
      self.assertAllEqual(given["port"][name], value, msg=name)


# In the original's virtualenv: the page faults of ten session calls that
# each fill and free a 256 MiB tensor.
_FAULTS = """
import resource
import tensorflow as tf
value = tf.placeholder(tf.float32, [])
total = tf.reduce_sum(tf.fill([64 << 20], value))
with tf.Session() as session:
  session.run(total, {value: 1.0})
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(10):
    session.run(total, {value: 1.0})
  print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


class KeepPagesTest(tf.test.TestCase):
  """--original_keep_pages: TensorFlow 1.5.1's jemalloc keeps freed pages."""

  def testTheOptionIsAddedUnlessTheUserSetsOne(self):
    self.assertEqual(original_run.environment(True, {"A": "1"}),
                     {"A": "1", "JEMALLOC_MALLOC_CONF": "lg_dirty_mult:-1"})
    mine = {"JEMALLOC_MALLOC_CONF": "narenas:1"}
    self.assertEqual(original_run.environment(True, mine), mine)
    self.assertEqual(original_run.environment(False, {"A": "1"}), {"A": "1"})

  def testAFreedBlockIsFaultedInOnceNotAtEveryCall(self):
    why = _why_no_original()
    if why:
      self.skipTest(why)

    def faults(keep_pages):
      out = subprocess.run(
          [original_run.venv_python(ORIGINAL_VENV), "-c", _FAULTS],
          env=original_run.environment(keep_pages, os.environ),
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
          check=True).stdout
      return int(out.split()[-1])

    kept, shipped = faults(True), faults(False)
    # As shipped, each call faults the block in anew: at least once per
    # 2 MiB (a huge page) of it, ten times.
    self.assertGreaterEqual(shipped, 10 * 128)
    self.assertLess(kept * 5, shipped)


class AgainstTheOriginalTest(tf.test.TestCase):
  """The port and the original on TensorFlow 1.5.1, from the same weights."""

  def setUp(self):
    super().setUp()
    why = _why_no_original()
    if why:
      self.skipTest(why)

  def testEveryLineAgreesToRounding(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = _corpus(tmp)
      out, err, status = _compare(
          "--original=" + ORIGINAL_DIR, "--original_venv=" + ORIGINAL_VENV,
          "--data_path=" + data, "--model=test", "--epochs=2",
          "--config_overrides=" + OVERRIDES)
    self.assertEqual(status, 0, err)
    self.assertIn("-  max_max_epoch = 1\n+  max_max_epoch = 2", out)
    rows = [m.groups() for m in map(_ROW.match, out.splitlines())
            if m and m.group(1) != "line" and not m.group(1).startswith("-")]
    labels = [r[0] for r in rows]
    self.assertLen([l for l in labels if l.startswith("epoch 1 at")], 10)
    self.assertEqual(labels[10:], ["epoch 1 train", "epoch 1 valid",
                                   "epoch 2 train", "epoch 2 valid", "test"])
    for label, original, port, _ in rows:
      self.assertAllClose(float(port), float(original), rtol=1e-4, atol=0,
                          msg=label)

  def testEachTrainingStepFromTheSameWeightsIsTheSame(self):
    """One step at a time, so that no difference can grow: each step's
    update, the gradients through the clipping, in both programs."""
    with tempfile.TemporaryDirectory() as tmp:
      data = testing.make_corpus(tmp, num_words=40, train_lines=400)
      fields = dict(num_layers=2, hidden_size=16, num_steps=6,
                    batch_size=4, learning_rate=1.0, vocab_size=50)
      code = os.path.join(tmp, "code")
      original_run.write_copy(ORIGINAL_DIR, code, "test", fields)
      script = os.path.join(tmp, "step.py")
      with open(script, "w") as f:
        f.write(_ORIGINAL_STEP)
      config = compare_original.port_config("test", ",".join(
          "%s=%s" % kv for kv in fields.items()))
      weights = original_checkpoint.initial_values(config, 1)
      train = compare_original.reader.ptb_raw_data(data)[0]
      rows = np.array(train[:len(train) // 4 * 4], np.int32).reshape(4, -1)
      for step in range(3):
        before = os.path.join(tmp, "w%d" % step)
        original_checkpoint.write(before, weights)
        after = os.path.join(tmp, "w%d-original" % step)
        subprocess.run([original_run.venv_python(ORIGINAL_VENV), script,
                        code, before, data, str(step), "1.0", after],
                       check=True, capture_output=True)
        original = original_checkpoint.read(after)
        port = _port_step(config, rows[:, step * 6:step * 6 + 7], weights)
        for name, w in weights.items():
          with self.subTest(step=step, weight=name):
            update = np.abs(original[name] - w).max()
            self.assertGreater(update, 0)
            # To rounding: of the update's sums, and of w + update.
            self.assertLessEqual(
                np.abs(port[name] - original[name]).max(),
                1e-5 * update + 2 * np.spacing(np.abs(w).max()))
        weights = original

  def testTheOriginalsCheckpointEvaluatesInThePort(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = _corpus(tmp)
      copy = os.path.join(tmp, "code")
      original_run.write_copy(
          ORIGINAL_DIR, copy, "test", dict(num_layers=2, hidden_size=8,
                                           num_steps=5, batch_size=4,
                                           learning_rate=0.2))
      save = os.path.join(tmp, "run")
      found, _ = compare_original.curves.run(
          "the original", original_run.command(
              original_run.venv_python(ORIGINAL_VENV), copy, data, "test",
              save), 0)
      # Its last save goes beside --save_path, named for the global step.
      ckpt, = [p[:-len(".index")] for p in glob.glob(save + "-*.index")]
      code, out, err = testing.run_script(
          "--data_path=" + data, "--model=test", "--num_gpus=0",
          "--config_overrides=" + OVERRIDES, "--init_from=" + ckpt,
          "--eval_only")
    self.assertEqual(code, 0, err)
    # The same to rounding: the two sum in their own orders, so a printed
    # third decimal may differ by one.
    for key, name in ((("valid", 1), "Valid"), (("test",), "Test")):
      got = re.search(r"^%s Perplexity: (\S+)$" % name, out, re.M)
      self.assertIsNotNone(got, out)
      self.assertAllClose(float(got.group(1)), found[key], rtol=1e-5)


def _port_step(config, rows, weights):
  """The port's weights after one training step on `rows` [batch, steps +
  1] from `weights` ({port name: array}), at learning rate 1.0."""
  with tf.Graph().as_default():
    model = ptb_word_lm_testing.build_tiny_model(config, rows, "basic")
    variables = {v.op.name: v for v in tf.compat.v1.trainable_variables()}
    with tf.compat.v1.Session() as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer()])
      for name, variable in variables.items():
        variable.load(weights[name], session)
      model.assign_lr(session, 1.0)
      session.run(model.train_op)
      return {name: session.run(v) for name, v in variables.items()}


# One training step of the original's own PTBModel (its code from argv[1],
# config class edited there), on window argv[4] of the training file of
# argv[3], from the checkpoint argv[2], at learning rate argv[5]; saves the
# weights to argv[6].
_ORIGINAL_STEP = """
import sys
code, ckpt, data_path, window, lr, out = sys.argv[1:7]
sys.path.insert(0, code)
sys.argv = [sys.argv[0], "--model=test", "--num_gpus=0"]
import numpy as np, tensorflow as tf
import ptb_word_lm, reader
ptb_word_lm.FLAGS(sys.argv)
config = ptb_word_lm.get_config()
train = reader.ptb_raw_data(data_path)[0]
b, t, i = config.batch_size, config.num_steps, int(window)
data = np.array(train[:len(train) // b * b], np.int32).reshape(b, -1)
class Input(object):
  batch_size, num_steps = b, t
  input_data = tf.constant(data[:, i * t:(i + 1) * t])
  targets = tf.constant(data[:, i * t + 1:(i + 1) * t + 1])
with tf.variable_scope("Model"):
  m = ptb_word_lm.PTBModel(is_training=True, config=config, input_=Input)
saver = tf.train.Saver(tf.trainable_variables())
with tf.Session() as s:
  s.run(tf.global_variables_initializer())
  saver.restore(s, ckpt)
  m.assign_lr(s, float(lr))
  s.run(m.train_op)
  saver.save(s, out, write_meta_graph=False)
"""


# Prints TensorFlow 1.5.1's l2_loss and reduce_sum of the vectors in the
# .npz file argv[1], as float32 bits, one pair a line.
_TF15_SUMS = """
import sys, numpy as np, tensorflow as tf
xs = np.load(sys.argv[1])
with tf.Session(config=tf.ConfigProto(intra_op_parallelism_threads=2)) as s:
  for k in sorted(xs.files, key=lambda k: int(k[4:])):
    a, b = s.run([tf.nn.l2_loss(xs[k]), tf.reduce_sum(xs[k])])
    print(np.float32(a).view(np.uint32), np.float32(b).view(np.uint32))
"""


class SumAsTf15Test(tf.test.TestCase):
  """The kernels' SumAsTf15 against TensorFlow 1.5.1's own sums."""

  def testEqualsTheOriginalsL2LossAndReduceSumBitForBit(self):
    why = _why_no_original()
    if why:
      self.skipTest(why)
    library = kernels_test.library_or_skip(self)
    rng = np.random.RandomState(3)
    # Under, at and over a lane's 8 and the 2 threads' 96,000 (l2_loss)
    # and 108,388 (reduce_sum) values; small's softmax_w: 2,000,000.
    sizes = (1, 7, 8, 9, 800, 10000, 80000, 95999, 96000, 108387, 108388,
             320000, 2000000)
    xs = [rng.uniform(-1, 1, n).astype(np.float32) * 0.1 for n in sizes]
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "x.npz")
      np.savez(path, *xs)
      script = os.path.join(tmp, "sums.py")
      with open(script, "w") as f:
        f.write(_TF15_SUMS)
      out = subprocess.run(
          [original_run.venv_python(ORIGINAL_VENV), script, path],
          capture_output=True, text=True, check=True).stdout
    want = [tuple(map(int, line.split())) for line in out.splitlines()]
    for n, x, (l2, total) in zip(sizes, xs, want):
      with self.subTest(size=n):
        got = [self.evaluate(library.sum_as_tf15(x, squares=s, threads=2))
               for s in (True, False)]
        self.assertEqual(tuple(np.float32(g).view(np.uint32) for g in got),
                         (l2, total))
    # Not TensorFlow 2's sums, which are exact to about 1e-7 here.
    exact = 0.5 * np.sum(xs[-1].astype(np.float64) ** 2)
    self.assertGreater(abs(float(self.evaluate(library.sum_as_tf15(
        xs[-1], squares=True, threads=2))) - exact) / exact, 1e-6)


# Prints TensorFlow 1.5.1's tf.global_norm of the arrays in the .npz file
# argv[1] (arr_0 an IndexedSlices' values, its indices arr_1), as float32
# bits.
_TF15_GLOBAL_NORM = """
import sys, numpy as np, tensorflow as tf
xs = np.load(sys.argv[1])
ts = [tf.IndexedSlices(tf.constant(xs["arr_0"]), tf.constant(xs["arr_1"]))]
ts += [tf.constant(xs["arr_%d" % k]) for k in range(2, len(xs.files))]
with tf.Session(config=tf.ConfigProto(intra_op_parallelism_threads=2)) as s:
  print(np.float32(s.run(tf.global_norm(ts))).view(np.uint32))
"""


class GlobalNormAsTf15Test(tf.test.TestCase):
  """--original_norm_threads's norm against TensorFlow 1.5.1's global_norm."""

  def testEqualsTheOriginalsClippingNormBitForBit(self):
    why = _why_no_original()
    if why:
      self.skipTest(why)
    kernels_test.library_or_skip(self)
    rng = np.random.RandomState(4)
    # Small's gradients in the original's order: the embedding's rows as
    # an IndexedSlices (one per word of a batch), then the dense ones.
    ids = rng.randint(0, 10000, 400).astype(np.int32)
    shapes = ((400, 200), (400, 800), (800,), (400, 800), (800,),
              (200, 10000), (10000,))
    xs = [(rng.normal(size=s) * 0.01).astype(np.float32) for s in shapes]
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "x.npz")
      np.savez(path, xs[0], ids, *xs[1:])
      script = os.path.join(tmp, "norm.py")
      with open(script, "w") as f:
        f.write(_TF15_GLOBAL_NORM)
      want = int(subprocess.run(
          [original_run.venv_python(ORIGINAL_VENV), script, path],
          capture_output=True, text=True, check=True).stdout)
    grads = [tf.IndexedSlices(xs[0], ids, (10000, 200))]
    grads += [tf.constant(x) for x in xs[1:]]
    variables = [tf.Variable(tf.zeros((10000, 200)))]
    variables += [tf.Variable(tf.zeros(s)) for s in shapes[1:]]
    got = self.evaluate(original_norm.global_norm(zip(grads, variables), 2))
    self.assertEqual(np.float32(got).view(np.uint32), want)
    exact = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in xs))
    self.assertGreater(abs(float(got) - exact) / exact, 1e-6)


if __name__ == "__main__":
  tf.test.main()
