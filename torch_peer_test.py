"""Tests of torch_peer.py, the PyTorch peer; they need torch.

Without torch (it is not a requirement of the project) they are skipped:
`python3 -m pip install torch==2.13.0` installs it.
"""

import contextlib
import copy
import functools
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock
import warnings

import numpy as np
import tensorflow as tf

from ptb import config as config_lib
from ptb import testing
from ptb.testing import HERE
from ptb.testing import TinyConfig
from ptb.testing import make_corpus
from ptb.errors import UserError
from ptb.config import epoch_learning_rate
from ptb_word_lm_test import LINE_FORMATS
from ptb_word_lm_test import _tutorial_training
import ptb_word_lm
import ptb_word_lm_testing
from ptb_word_lm_testing import build_tiny_model
import reader

HAVE_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = ("torch is not installed (it is optional: python3 -m pip install "
            "torch==2.13.0)")
if HAVE_TORCH:
  import torch  # pylint: disable=g-import-not-at-top
  import torch_peer  # pylint: disable=g-import-not-at-top


def port_run(config, data, epochs):
  """ptb_word_lm.py's training and evaluation of `epochs` epochs.

  Args:
    config: a BASIC config without dropout.
    data: (train, valid, test) id lists.
    epochs: epochs to train, at the tutorial's learning rates.

  Returns:
    ({variable name: initial value}, {name: final value}, the cost of every
    training step, the valid perplexity of every epoch, the test
    perplexity).
  """
  test_config = copy.copy(config)
  test_config.batch_size = test_config.num_steps = 1
  with tf.Graph().as_default():
    train = build_tiny_model(config, np.array(data[0]), config.rnn_mode,
                             seed=11)
    valid, test = (build_tiny_model(c, np.array(ids), config.rnn_mode,
                                    is_training=False)
                   for c, ids in ((config, data[1]), (test_config, data[2])))
    params = {v.op.name: v for v in tf.compat.v1.trainable_variables()}
    with tf.compat.v1.Session() as sess:

      def perplexity(model):
        sess.run(model.reset_state)
        costs = [sess.run([model.cost, model.update_state])[0]
                 for _ in range(model.input.epoch_size)]
        return np.exp(np.sum(costs) / (len(costs) * model.input.num_steps))

      sess.run([tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()])
      initial = sess.run(params)
      costs, valid_perplexities = [], []
      for epoch in range(epochs):
        train.assign_lr(sess, epoch_learning_rate(config, epoch))
        sess.run(train.reset_state)
        costs += [sess.run([train.cost, train.train_op,
                            train.update_state])[0]
                  for _ in range(train.input.epoch_size)]
        valid_perplexities.append(perplexity(valid))
      return (initial, sess.run(params), costs, valid_perplexities,
              perplexity(test))


def recording_train_step():
  """A stand-in for torch_peer.train_step that records calls and results.

  Returns:
    (the stand-in, the list of (lr, cost, norm) it fills).
  """
  real, calls = torch_peer.train_step, []

  def train_step(*args, **kwargs):
    result = real(*args, **kwargs)
    calls.append((args[4],) + result[:2])
    return result

  return train_step, calls


class OneThreadTestCase(tf.test.TestCase):
  """A test that runs torch on one thread.

  The models here are tiny, so a second OpenMP thread only adds a barrier
  to every op; on a loaded machine each barrier waits for a thread that the
  scheduler has set aside, and a test of a fraction of a second took tens of
  seconds.
  """

  def setUp(self):
    super().setUp()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    self.addCleanup(torch.set_num_threads, threads)


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class SameModelAsThePortTest(OneThreadTestCase):
  """From the same weights, the peer takes the port's training steps.

  No dropout, so the two compute the same numbers: every step's cost (with
  the state carried from window to window and zeroed at each pass), the
  clipping and its norm, the learning rate of each epoch, the weights at
  the end, and the valid and test perplexities.
  """

  def testTrainEpochsTakesThePortsStepsFromItsWeights(self):
    config = TinyConfig()  # 2 layers, hidden 8, batch 4, 5 steps
    config.max_grad_norm = 1.0
    config.max_epoch, config.lr_decay, epochs = 1, 0.5, 2
    with tempfile.TemporaryDirectory() as tmp:
      *data, config.vocab_size = reader.ptb_raw_data(
          make_corpus(tmp, train_lines=30))
    initial, final, want_costs, want_valid, want_test = port_run(
        config, data, epochs)

    peer = torch_peer.PTBModel(config)
    torch_peer.load_tutorial_weights(peer, initial)
    stand_in, calls = recording_train_step()
    out = io.StringIO()
    with mock.patch.object(torch_peer, "train_step", stand_in), \
        contextlib.redirect_stdout(out):
      torch_peer.train_epochs(peer, config, data, epochs)
    lrs, costs, norms = zip(*calls)

    epoch_size = len(want_costs) // epochs
    self.assertEqual(lrs, (1.0,) * epoch_size + (0.5,) * epoch_size)
    self.assertAllClose(costs, want_costs, rtol=1e-4)
    # Steps with and without clipping both occur.
    self.assertGreater(max(norms), config.max_grad_norm)
    self.assertLess(min(norms), config.max_grad_norm)
    trained = {name: p.detach().numpy()
               for name, p in peer.named_parameters()}
    torch_peer.load_tutorial_weights(peer, final)
    for name, want in peer.named_parameters():
      self.assertAllClose(trained[name], want.detach().numpy(), rtol=1e-4,
                          atol=1e-6, msg=name)
    text = out.getvalue()
    valid = [float(v) for v in re.findall(r"Valid Perplexity: (\S+)", text)]
    self.assertAllClose(valid, want_valid, rtol=1e-4)
    test = float(re.search(r"Test Perplexity: (\S+)", text).group(1))
    self.assertAllClose(test, want_test, rtol=1e-4)

  def testClipsByTheTutorialsNorm(self):
    """The norm counts the embedding's gradient one row per word looked up.

    So does tf.gradients' IndexedSlices in the tutorial; a dense gradient
    adds a repeated word's rows first. With 3 words and weights in ±1 the
    embedding's part of the norm is large enough to tell the two apart.
    """
    config = TinyConfig()
    config.vocab_size, config.max_grad_norm, num_calls = 3, 1.0, 3
    size, vocab = config.hidden_size, config.vocab_size
    rng = np.random.RandomState(5)
    rows = rng.randint(0, vocab, (config.batch_size,
                                  num_calls * config.num_steps + 1))
    names = ["Model/embedding"] + [
        "Model/RNN/cell_%d/%s" % (k, n) for k in range(config.num_layers)
        for n in ("kernel", "bias")] + ["Model/softmax_w", "Model/softmax_b"]
    shapes = [(vocab, size)] + [(2 * size, 4 * size), (4 * size,)] * (
        config.num_layers) + [(size, vocab), (vocab,)]
    weights = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    want_costs, want_norms, _ = _tutorial_training(weights, rows, config,
                                                   num_calls)

    peer = torch_peer.PTBModel(config)
    torch_peer.load_tutorial_weights(peer, dict(zip(names, weights)))
    peer.train()
    state = peer.zero_state(config.batch_size)
    costs, norms, dense_norms = [], [], []
    for x, y in zip(*torch_peer.windows(rows.reshape(-1), config.batch_size,
                                        config.num_steps)):
      cost, norm, state = torch_peer.train_step(
          peer, x, y, state, config.learning_rate, config.max_grad_norm)
      costs.append(cost)
      norms.append(norm)
      dense_norms.append(float(torch.nn.utils.get_total_norm(
          [p.grad for p in peer.parameters() if p.grad is not None])))
    self.assertAllClose(norms, want_norms, rtol=1e-5)
    self.assertAllClose(costs, want_costs, rtol=1e-5)
    self.assertNotAllClose(dense_norms, want_norms, rtol=0.02)
    # The first step is not clipped, the others are.
    self.assertLess(norms[0], config.max_grad_norm)
    self.assertGreater(min(norms[1:]), config.max_grad_norm)

  def testStartsAsThePortsBasicAndBlock(self):
    """LSTM biases zero (bias_hh also frozen), the rest uniform in
    ±init_scale, as ptb/params.py starts BASIC and BLOCK."""
    config = TinyConfig()
    config.hidden_size, config.vocab_size = 64, 100
    scale = config.init_scale
    peer = torch_peer.PTBModel(config)
    for name, p in peer.named_parameters():
      value = p.detach().numpy()
      if name.startswith("lstm.bias_"):
        self.assertEqual(float(np.abs(value).max()), 0.0, name)
        self.assertEqual(p.requires_grad, name.startswith("lstm.bias_ih"))
      else:
        self.assertLessEqual(np.abs(value).max(), scale, name)
        self.assertAllClose(np.abs(value).mean(), scale / 2, rtol=0.25,
                            msg=name)


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class LearningRateScheduleTest(OneThreadTestCase):

  def testEachEpochTrainsAtTheTutorialsRate(self):
    config = TinyConfig()
    config.learning_rate, config.max_epoch, config.lr_decay = 0.5, 2, 0.25
    with tempfile.TemporaryDirectory() as tmp:
      *data, config.vocab_size = reader.ptb_raw_data(
          make_corpus(tmp, train_lines=30))
    stand_in, calls = recording_train_step()
    out = io.StringIO()
    with mock.patch.object(torch_peer, "train_step", stand_in), \
        contextlib.redirect_stdout(out):
      torch_peer.train_epochs(torch_peer.PTBModel(config), config, data, 4)
    rates = [0.5, 0.5, 0.125, 0.03125]
    self.assertEqual(re.findall(r"Learning rate: (\S+)", out.getvalue()),
                     ["%.3f" % r for r in rates])
    epoch_size = len(calls) // 4
    self.assertEqual([lr for lr, _, _ in calls],
                     [r for r in rates for _ in range(epoch_size)])


def autocast_lstm_runs():
  """A context in which nn.LSTM runs under bfloat16 autocast on this CPU.

  Where oneDNN builds no bfloat16 LSTM (an AVX2 CPU), oneDNN is switched
  off: nn.LSTM then runs as torch's own cell, whose gate products autocast
  takes to bfloat16 as well. What these tests check is where the peer puts
  autocast, which both kernels show.
  """
  context = contextlib.ExitStack()
  if torch_peer.bf16_lstm_failure() is not None:
    # Setting oneDNN's flags warns, on entry and exit, of a TF32 mode for
    # Intel GPUs, which has nothing to do with these tests.
    context.enter_context(warnings.catch_warnings())
    warnings.filterwarnings("ignore", "TF32 acceleration", UserWarning)
    context.enter_context(torch.backends.mkldnn.flags(enabled=False))
  return context


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class Bf16Test(OneThreadTestCase):
  """--bf16: the forward pass under bfloat16 autocast, the update float32."""

  def testAStepIsTheFloat32StepToBfloat16sPrecision(self):
    config = TinyConfig()  # 2 layers, hidden 8, batch 4, 5 steps, 30 words
    torch.manual_seed(3)
    start = torch_peer.PTBModel(config)
    models = {bf16: copy.deepcopy(start) for bf16 in (False, True)}
    rng = np.random.RandomState(7)
    x, y = (torch.from_numpy(rng.randint(
        0, config.vocab_size, (config.num_steps, config.batch_size)))
            for _ in range(2))
    steps = {}
    with autocast_lstm_runs():
      for bf16, model in models.items():
        model.train()
        steps[bf16] = torch_peer.train_step(
            model, x, y, model.zero_state(config.batch_size), 1.0,
            config.max_grad_norm, bf16=bf16)
    (cost32, norm32, state32), (cost16, norm16, state16) = (
        steps[False], steps[True])
    # Near the float32 step, but not it: autocast ran.
    self.assertNotEqual(cost16, cost32)
    self.assertAllClose(cost16, cost32, rtol=2e-2)
    self.assertAllClose(norm16, norm32, rtol=5e-2)
    # The LSTM's products too, not only the softmax's: its state moved.
    for s16, s32 in zip(state16, state32):
      self.assertEqual(s16.dtype, torch.float32)
      self.assertNotAllEqual(s16.numpy(), s32.numpy())
      self.assertAllClose(s16.numpy(), s32.numpy(), atol=2e-2)
    # The weights and their gradients stay float32; each weight's update is
    # float32's to bfloat16's precision (the norm of the difference).
    for (name, p0), p16, p32 in zip(start.named_parameters(),
                                    models[True].parameters(),
                                    models[False].parameters()):
      self.assertEqual(p16.dtype, torch.float32, name)
      if p16.requires_grad:
        self.assertEqual(p16.grad.dtype, torch.float32, name)
        update16, update32 = (p.detach() - p0.detach() for p in (p16, p32))
        self.assertLess(float(torch.linalg.norm(update16 - update32)),
                        2e-2 * float(torch.linalg.norm(update32)), name)

  def testFlagReachesEveryPassAndTheSpeedLine(self):
    real, flags = torch_peer.cost_of, []

    def cost_of(*args):
      flags.append(args[4])
      return real(*args)

    with tempfile.TemporaryDirectory() as tmp, autocast_lstm_runs(), \
        mock.patch.object(torch_peer, "bf16_lstm_failure",
                          return_value=None), \
        mock.patch.object(torch_peer, "cost_of", cost_of):
      args = ["--data_path=" + make_corpus(tmp, train_lines=100),
              "--model=test", "--config_overrides=vocab_size=31", "--bf16"]
      curve = run_main(*args, "--epochs=1").splitlines()
      speed = run_main(*args, "--steps=2", "--warmup=1").splitlines()
    # Training, valid and test passes, and the speed's steps, all under it.
    self.assertGreater(len(flags), 3)
    self.assertEqual(set(flags), {True})
    # The curve's lines are ptb_word_lm.py's, as the shared peer's are.
    for line in curve[1:]:
      self.assertTrue(any(re.fullmatch(f, line) for f in LINE_FORMATS), line)
    self.assertRegex(curve[-1], r"^Test Perplexity: \d")
    self.assertRegex(speed[-2], r"^model=test vocab_size=31 bf16 torch=\S+ "
                     r"threads=1 steps=2 seconds=")
    self.assertRegex(speed[-1], r"^wps: \d+$")

  def testTheProbeTellsWhetherTheLSTMRuns(self):
    """bf16_lstm_failure agrees with a real --bf16 step, with oneDNN on."""
    config = TinyConfig()
    model = torch_peer.PTBModel(config)
    windows = torch_peer.windows(np.arange(41) % config.vocab_size,
                                 config.batch_size, config.num_steps)
    failure = torch_peer.bf16_lstm_failure()
    try:
      torch_peer.train_step(model, windows[0][0], windows[1][0],
                            model.zero_state(config.batch_size), 1.0,
                            config.max_grad_norm, bf16=True)
    except RuntimeError as e:
      self.assertIsNotNone(failure, e)
      self.assertIn(failure, " ".join(str(e).split()))
    else:
      self.assertIsNone(failure)


def run_main(*args):
  """Runs torch_peer.main with the command line `args` here; returns stdout."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    torch_peer.main(list(args))
  return out.getvalue()


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class MainTest(OneThreadTestCase):
  """torch_peer.main's two modes, in this process."""

  def testEpochsPrintThePortsLines(self):
    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp, train_lines=100)
      # The corpus's 31 words, not the test config's 10,000: a softmax
      # 250 times smaller in every step of the test pass, a word a step.
      out = run_main("--data_path=" + tmp, "--model=test", "--epochs=2",
                     "--config_overrides=max_epoch=1,vocab_size=31")
      train = reader.ptb_raw_data(tmp)[0]
    lines = out.splitlines()
    self.assertEqual(lines[0], "Config overrides: max_epoch=1, vocab_size=31")
    for line in lines[1:]:
      self.assertTrue(any(re.fullmatch(f, line) for f in LINE_FORMATS),
                      "not one of ptb_word_lm.py's lines: %r" % line)
    self.assertEqual(lines[1], "Epoch: 1 Learning rate: 1.000")
    self.assertIn("Epoch: 2 Learning rate: 0.500", lines)
    # ptb_word_lm.run_epoch's cadence and fractions: about ten lines an
    # epoch, here one at every step of the short epochs.
    epoch_size = reader.epoch_size(len(train), 20, 2)
    every = max(1, epoch_size // 10)
    printed = [s for s in range(epoch_size) if s % every == 10 % every]
    fractions = [l.split()[0] for l in lines if l.endswith(" wps")]
    self.assertEqual(fractions, ["%.3f" % (s / epoch_size)
                                 for s in printed] * 2)
    self.assertRegex(lines[-1], r"^Test Perplexity: ")

  def testEpochsResumeAfterTheSavedEpoch(self):
    def curve(out):
      # The lines but for speeds: learning rates and perplexities.
      return [l.split(" speed:")[0] for l in out.splitlines()
              if l.startswith(("Epoch", "Test", "0."))]

    with tempfile.TemporaryDirectory() as tmp:
      make_corpus(tmp, train_lines=100)
      # With dropout, so that the resumed epoch needs torch's random state.
      args = ["--data_path=" + tmp, "--model=test", "--config_overrides="
              "max_epoch=1,vocab_size=31,keep_prob=0.5"]
      whole = run_main(*args, "--epochs=2")
      save = os.path.join(tmp, "peer")
      first = run_main(*args, "--epochs=1", "--save_path=" + save)
      resumed = run_main(*args, "--epochs=2", "--save_path=" + save)
      with self.assertRaisesRegex(UserError, "saved with another config"):
        run_main(args[0], args[1], args[2].replace("0.5", "0.4"),
                 "--epochs=3", "--save_path=" + save)
      # A float32 curve goes on in float32 only.
      with mock.patch.object(torch_peer, "bf16_lstm_failure",
                             return_value=None), \
          self.assertRaisesRegex(UserError, "saved by a curve without "
                                 "--bf16; resume it without it"):
        run_main(*args, "--epochs=3", "--bf16", "--save_path=" + save)
    self.assertIn("Resuming from epoch 1 of %s\n"
                  % os.path.join(save, "torch_peer.pt"), resumed)
    self.assertLen(curve(whole), 2 * curve(whole).index(
        "Epoch: 2 Learning rate: 0.500") + 1)
    self.assertEqual(curve(first)[:-1] + curve(resumed), curve(whole))

  def testSpeedPrintsTheSharedPeersTwoLines(self):
    with tempfile.TemporaryDirectory() as tmp:
      out = run_main("--data_path=" + make_corpus(tmp), "--model=test",
                     "--steps=3", "--warmup=1")
    lines = out.splitlines()
    self.assertLen(lines, 2)
    match = re.fullmatch(r"model=test torch=\S+ threads=\d+ steps=3 "
                         r"seconds=(\d+\.\d\d) last_loss=(\d+\.\d{3}) "
                         r"peak_rss_mib=\d+ page_faults_per_step=\d+",
                         lines[0])
    self.assertIsNotNone(match, lines[0])
    # The last step's cross-entropy per word: near log(10,000) = 9.2 for
    # the test config's vocabulary after four steps.
    self.assertBetween(float(match.group(2)), 8.0, 9.3)
    # The words of the timed steps over their seconds, each as rounded.
    wps = re.fullmatch(r"wps: (\d+)", lines[1])
    self.assertIsNotNone(wps, lines[1])
    self.assertAllClose(3 * 20 * 2 / int(wps.group(1)),
                        float(match.group(1)), atol=0.006, rtol=0.01)

  def testRunsWithoutTensorFlowAndReadsTheClassAsEdited(self):
    """Real processes in which `import tensorflow` fails: the peer trains,
    and a config class edited in place is the one it reads."""
    probe = ("import sys, runpy; sys.modules['tensorflow'] = None; "
             "sys.argv = sys.argv[1:]; "
             "runpy.run_path('torch_peer.py', run_name='__main__')")
    with tempfile.TemporaryDirectory() as tmp:
      for name in ("torch_peer.py", "reader.py", "ptb_word_lm.py"):
        shutil.copy(os.path.join(HERE, name), tmp)
      shutil.copytree(os.path.join(HERE, "ptb"), os.path.join(tmp, "ptb"))
      data = os.path.join(tmp, "data")
      os.mkdir(data)
      command = [sys.executable, "-c", probe, "torch_peer.py",
                 "--data_path=" + make_corpus(data), "--model=test",
                 "--steps=1", "--warmup=0", "--config_overrides=vocab_size=31"]
      ran = subprocess.run(command, cwd=tmp, capture_output=True, text=True,
                           timeout=120, check=False)
      script = os.path.join(tmp, "ptb_word_lm.py")
      with open(script, encoding="utf-8") as f:
        source = f.read()
      # TestConfig's hidden_size, the only class with 2, edited to 0.
      self.assertEqual(source.count("  hidden_size = 2\n"), 1)
      with open(script, "w", encoding="utf-8") as f:
        f.write(source.replace("  hidden_size = 2\n", "  hidden_size = 0\n"))
      edited = subprocess.run(command, cwd=tmp, capture_output=True,
                              text=True, timeout=120, check=False)
    self.assertEqual(ran.returncode, 0, ran.stderr)
    self.assertRegex(ran.stdout.splitlines()[-1], r"^wps: \d+$")
    self.assertNotIn("Traceback", ran.stderr)
    self.assertEqual(edited.returncode, 2, edited.stderr)
    self.assertRegex(edited.stderr.splitlines()[-1],
                     r"^torch_peer\.py: error: .*hidden_size")

  def testTheConfigsFromTheSourceAreThePorts(self):
    read = config_lib.configs_from_source(os.path.join(HERE, "ptb_word_lm.py"))
    self.assertEqual(list(read), list(ptb_word_lm.CONFIGS))
    for name, cls in read.items():
      self.assertEqual(config_lib.config_fields(cls()),
                       config_lib.config_fields(ptb_word_lm.CONFIGS[name]()))


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class RefusedCommandLineTest(ptb_word_lm_testing.SavePathTest):
  """Bad flags and inputs end in one line before any step is taken."""

  def setUp(self):
    super().setUp()
    self.data = make_corpus(self.tmp)

  def _saves(self):
    """--save_path directories holding files that are no peer's save.

    Returns:
      (one with a save cut short, one with another program's torch file).
    """
    cut, other = (os.path.join(self.tmp, name) for name in ("cut", "other"))
    for directory in (cut, other):
      os.mkdir(directory)
    torch.save({"weights": [1.0, 2.0]}, os.path.join(other, "torch_peer.pt"))
    with open(os.path.join(other, "torch_peer.pt"), "rb") as f:
      whole = f.read()
    with open(os.path.join(cut, "torch_peer.pt"), "wb") as f:
      f.write(whole[:len(whole) // 2])
    return cut, other

  def _run(self, args):
    """torch_peer.py's entry point on `args` after a valid command line.

    Its training step is replaced by one that fails the test if called.
    """
    args = ["--data_path=" + self.data, "--model=test"] + args
    with mock.patch.object(torch_peer, "train_step") as step:
      result = testing.run_entry_point(
          functools.partial(torch_peer.run, args), ["torch_peer.py"] + args)
    self.assertFalse(step.called, "trained first")
    return result

  def testBf16WhereOneDNNHasNoBfloat16LSTM(self):
    with mock.patch.object(torch_peer, "bf16_lstm_failure",
                           return_value="could not create a primitive"):
      testing.assert_each_refused(self, "torch_peer.py", [
          (["--bf16"], "--bf16: nn.LSTM cannot run under bfloat16 autocast "
           "on this CPU, whose oneDNN builds no bfloat16 LSTM (could not "
           "create a primitive)", 1)], self._run)

  def testEachEndsInOneLineBeforeAnyStep(self):
    gzipped = testing.make_gzipped_corpus(os.path.join(self.tmp, "gzipped"))
    a_file = os.path.join(self.data, "ptb.test.txt")
    cut, other = self._saves()
    testing.assert_each_refused(self, "torch_peer.py", [
        (["--steps=0"], "--steps=0 must be at least 1", 2),
        (["--warmup=-1"], "--warmup=-1 must be 0 or more", 2),
        (["--epochs=-2"], "--epochs=-2 must be 0 or more", 2),
        (["--seed=-1"], "--seed=-1 must be 0 or more", 2),
        (["--seed=%d" % 2**64], "must be at most 18446744073709551615", 2),
        (["--steps=x"], "argument --steps: invalid int value: 'x'", 2),
        (["--bogus"], "unrecognized arguments: --bogus", 2),
        (["--model=huge"], "Invalid model: huge", 2),
        (["--config_overrides=nope=1"], "unknown field 'nope'", 2),
        (["--data_path=" + os.path.join(self.tmp, "nowhere")],
         "does not exist", 1),
        (["--data_path=" + gzipped], "ptb.train.txt is not UTF-8 text", 1),
        (["--config_overrides=vocab_size=5"],
         "the training corpus has 31 distinct words", 1),
        (["--epochs=1", "--save_path=" + a_file],
         "cannot be written: Not a directory", 1),
        (["--epochs=1", "--save_path=" + cut],
         "torch_peer.pt is not a save of torch_peer.py (RuntimeError: ", 1),
        (["--epochs=1", "--save_path=" + other],
         "torch_peer.pt is not a save of torch_peer.py (it lacks its fields)",
         1),
    ], self._run)
    # One as a program: the real entry point.
    testing.assert_error_line(
        self, "torch_peer.py", testing.run_program(
            "torch_peer.py", ["--model=huge", "--data_path=" + HERE]),
        "torch_peer.py: error: Invalid model: huge; valid values are small, "
        "medium, large, test", 2, alone=False)


if __name__ == "__main__":
  tf.test.main()
