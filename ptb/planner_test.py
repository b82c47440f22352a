"""Tests of the measuring planner: what it times, keeps and applies."""

import dataclasses
import json
import os
import tempfile
import time
import types
from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import plan as plan_lib
from ptb import planner
from ptb import testing
from ptb.bfloat16 import BFLOAT16, FLOAT32


def _config(**changes):
  """A config of 8 steps x 8 rows, hidden 16 (one layer), vocab 50."""
  config = testing.TinyConfig()
  config.num_layers, config.hidden_size, config.vocab_size = 1, 16, 50
  config.batch_size, config.num_steps = 8, 8
  for name, value in changes.items():
    setattr(config, name, value)
  return config


def _make(directory, products=FLOAT32, mode="measure", config=None,
          devices=("/cpu:0",), kernels=None, min_flops=0):
  config = config or _config()
  eval_config = _config(batch_size=1, num_steps=1)
  return planner.make(mode, config, list(devices), tf.float32,
                      kernels or plan_lib.offered(), 1, eval_config, 1,
                      products, directory=directory, min_flops=min_flops,
                      log=open(os.devnull, "w"))


class PickTest(tf.test.TestCase):

  def testTheRulesStayWithinTheMargin(self):
    self.assertEqual(planner._pick({"a": 1.0, "b": 1.04}, "b"), "b")
    self.assertEqual(planner._pick({"a": 1.0, "b": 1.06}, "b"), "a")
    self.assertEqual(planner._pick({"a": 1.0, "b": 0.5}, "a"), "b")
    # The rules' choice is not a candidate (BlockLSTM's own products).
    self.assertEqual(planner._pick({"a": 2.0, "b": 1.0}, "c"), "b")

  def testBfloat16OnlyWhereItWinsByTheMargin(self):
    pick = planner._products_dtype
    self.assertEqual(pick({FLOAT32: 1.0, BFLOAT16: 0.97}), FLOAT32)
    self.assertEqual(pick({FLOAT32: 1.0, BFLOAT16: 1.02}), FLOAT32)
    self.assertEqual(pick({FLOAT32: 1.0, BFLOAT16: 0.90}), BFLOAT16)
    # float32 alone (no --use_bf16): nothing to choose.
    self.assertEqual(pick({FLOAT32: 1.0}), FLOAT32)

  def testMeasureKeepsFloat32WhereBfloat16WinsTooLittle(self):
    # Parts timed as the how-to's class's LSTM on an Intel Xeon with AMX
    # (bfloat16 2 % slower) and a softmax layer that bfloat16 halves.
    layer = {FLOAT32: 1.0, BFLOAT16: 1.02}
    softmax = {FLOAT32: 1.0, BFLOAT16: 0.5}
    part = types.SimpleNamespace(paths=(plan_lib.WAVEFRONT,))
    step = types.SimpleNamespace(train=types.SimpleNamespace(
        lstm=part, softmax=part))
    lstm_part = lambda c, p, k, d, *a: (
        (plan_lib.MATMUL, plan_lib.SWAPPED), plan_lib.PLAIN, layer[d])
    softmax_part = lambda c, p, d, *a: (plan_lib.PLAIN, softmax[d])
    with mock.patch.object(planner, "_lstm_part", lstm_part), \
         mock.patch.object(planner, "_softmax_part", softmax_part):
      choices, _ = planner.measure(
          None, {BFLOAT16: step, FLOAT32: step}, None)
    self.assertEqual((choices.lstm_products, choices.softmax_products),
                     (FLOAT32, BFLOAT16))


class MedianTimesTest(tf.test.TestCase):

  def _builds(self, names, calls, slow_calls=()):
    """Builders whose call appends its name to `calls`; the calls counted in
    `slow_calls` (of all candidates, warm-ups included) sleep 50 ms."""
    def builder(name):
      def call():
        calls.append(name)
        if len(calls) in slow_calls:
          time.sleep(0.05)
        return np.float32(0)
      return lambda: tf.py_function(call, [], tf.float32)
    return {name: builder(name) for name in names}

  def testCandidatesTakeTurns(self):
    calls = []
    times = planner._median_times(self._builds("abc", calls), 3)
    self.assertEqual(sorted(times), ["a", "b", "c"])
    # One warm-up each, then a call each a round, the first rotating.
    self.assertEqual("".join(calls), "abc" + "abc" + "bca" + "cab")

  def testASlowStretchOfTheMachineDecidesNothing(self):
    # Three calls in a row are slow (after the two warm-ups): timed in one
    # stretch, they would be three of a's five and make its median slow.
    times = planner._median_times(
        self._builds("ab", [], slow_calls=(3, 4, 5)), 5)
    self.assertLess(max(times.values()), 0.025)

  def testNoCandidates(self):
    self.assertEqual(planner._median_times({}, 3), {})


class MakeTest(tf.test.TestCase):

  def testEstimateIsTheRules(self):
    plan = _make(None, mode="estimate")
    self.assertEqual((plan.how, plan.why),
                     ("estimate", "the rules of ptb/plan.py"))
    self.assertEqual(plan, plan_lib.make(
        _config(), ["/cpu:0"], tf.float32, plan_lib.offered(), 1,
        _config(batch_size=1, num_steps=1), 1))

  def testRulesKeptWhereTimingWouldChooseNothing(self):
    with tempfile.TemporaryDirectory() as tmp:
      small = _make(tmp, min_flops=planner.MIN_FLOPS)
      self.assertIn("too small to time", small.why)
      gpu = _make(tmp, devices=("/gpu:0",))
      self.assertIn("GPU towers", gpu.why)
      self.assertEqual(os.listdir(tmp), [])
      self.assertEqual(dataclasses.replace(small, how="estimate",
                                           why=_make(tmp, mode="estimate").why),
                       _make(tmp, mode="estimate"))

  def testTimesOnceThenReadsTheWisdom(self):
    with tempfile.TemporaryDirectory() as tmp:
      first = _make(tmp)
      self.assertEqual(first.how, "measure")
      self.assertIn("timed in", first.why)
      [name] = os.listdir(tmp)
      with open(os.path.join(tmp, name)) as f:
        kept = json.load(f)
      self.assertIn("plain", kept["timings"]["softmax_float32"]
                    ["input_gradient"])
      # On the wavefront (hidden 16) the LSTM's paths are the rules', timed.
      rules = first.train.lstm
      self.assertEqual(list(kept["timings"]["lstm_float32"]["recurrent"]),
                       ["%s/%s" % (rules.forward, rules.backward)])
      self.assertEqual(kept["choices"]["recurrent"],
                       [rules.forward, rules.backward])
      real, planner.measure = planner.measure, None  # any timing would fail
      try:
        second = _make(tmp)
      finally:
        planner.measure = real
      self.assertEqual(second.why, "wisdom of %s" % os.path.join(tmp, name))
      self.assertEqual(dataclasses.replace(second, why=first.why), first)
      # Another config is another key: timed afresh.
      _make(tmp, config=_config(hidden_size=24))
      self.assertLen(os.listdir(tmp), 2)

  def testEveryRecurrentPathTimedLayerByLayer(self):
    # Hidden 1024: the LAYER path, one layer after the other.
    with tempfile.TemporaryDirectory() as tmp:
      plan = _make(tmp, config=_config(hidden_size=1024, batch_size=2,
                                       num_steps=2, vocab_size=20))
      self.assertEqual(plan.train.lstm.paths, (plan_lib.LAYER,))
      [name] = os.listdir(tmp)
      with open(os.path.join(tmp, name)) as f:
        timed = json.load(f)["timings"]["lstm_float32"]["recurrent"]
      self.assertEqual(len(timed), 4 if plan_lib.offered().isa else 3)

  def testTheWisdomsChoicesAreApplied(self):
    kernels = plan_lib.Kernels("avx512", "test", bf16=True)
    with tempfile.TemporaryDirectory() as tmp:
      real, planner.measure = planner.measure, lambda *a: (
          plan_lib.Choices(
              recurrent=(plan_lib.MATMUL, plan_lib.PLAIN),
              input_gradients=plan_lib.SWAPPED,
              softmax_input_gradient=plan_lib.SWAPPED,
              lstm_products=FLOAT32, softmax_products=BFLOAT16), {})
      try:
        plan = _make(tmp, BFLOAT16, kernels=kernels)
      finally:
        planner.measure = real
      train = plan.train
      self.assertEqual((train.lstm.forward, train.lstm.backward,
                        train.lstm.input_gradients, train.softmax.input_gradient),
                       (plan_lib.MATMUL, plan_lib.PLAIN, (plan_lib.SWAPPED,) * 2,
                        plan_lib.SWAPPED))
      # The dtypes hold in every step; the paths in the training step.
      for step in (plan.train, plan.valid, plan.test):
        self.assertEqual((step.lstm.products, step.softmax.products),
                         (FLOAT32, BFLOAT16))
      self.assertEqual(plan_lib.fields(plan)["products"],
                       "lstm:float32,softmax:bfloat16")
      self.assertTrue(plan_lib.line(plan).endswith(
          "plan=measure (%s)" % plan.why))
      # A file that cannot be read is no wisdom: timed again.
      [name] = os.listdir(tmp)
      with open(os.path.join(tmp, name), "w") as f:
        f.write("{")
      self.assertIn("timed in", _make(tmp, BFLOAT16, kernels=kernels).why)

  def testAnUnwritableDirectoryKeepsNothingAndSaysSo(self):
    with tempfile.TemporaryDirectory() as tmp:
      blocked = os.path.join(tmp, "file")
      open(blocked, "w").close()  # a file where the directory should be
      plan = _make(os.path.join(blocked, "wisdom"))
      self.assertRegex(plan.why, r"^timed in [0-9.]+ s, not kept: ")

  def testKernelsRefusedWhereThisDtypeHasNoPanels(self):
    with self.assertRaisesRegex(ValueError, "no kernels' panels"):
      plan_lib.lstm("basic", 1, 16, 8, 8, isa="avx512", products=BFLOAT16,
                    bf16=False, recurrent=(plan_lib.KERNELS, plan_lib.KERNELS))


class CandidatesTest(tf.test.TestCase):
  """Every path the planner may pick computes the same products."""

  def _run(self, build):
    graph = tf.Graph()
    with graph.as_default():
      tf.compat.v1.set_random_seed(3)
      fetch = build()
      init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(init)
      return session.run(fetch)

  def testRecurrentCandidatesAgree(self):
    kernels = plan_lib.offered()
    rules = plan_lib.lstm("basic", 1, 16, 8, 8, isa=kernels.isa)
    pairs = planner._recurrent_candidates(rules, kernels, FLOAT32)
    self.assertIn((plan_lib.MATMUL, plan_lib.SWAPPED), pairs)
    self.assertEqual((plan_lib.KERNELS, plan_lib.KERNELS) in pairs,
                     kernels.isa is not None)
    sums = [self._run(planner.recurrent_chain(
        dataclasses.replace(rules, forward=f, backward=b, isa=kernels.isa),
        8, 16, 8)) for f, b in pairs]
    self.assertAllClose(sums, [sums[0]] * len(sums), rtol=1e-5)

  def testTransposedCandidatesAgree(self):
    plain, swapped = (self._run(planner.transposed(24, 40, 16, s, FLOAT32))
                      for s in (False, True))
    self.assertAllClose(plain, swapped, rtol=1e-5)
    self.assertNotAllClose(plain, 0.0)

  def testStepFlops(self):
    config = _config()
    # LSTM: 3 products of 64 rows x 32 x 64, softmax: 3 of 64 x 16 x 50.
    self.assertEqual(planner.step_flops(config),
                     3 * 2 * 64 * 32 * 64 + 3 * 2 * 64 * 16 * 50)
    self.assertEqual(np.sign(planner.step_flops(testing.TinyConfig())), 1)


if __name__ == "__main__":
  tf.test.main()
