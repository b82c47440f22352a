"""Tests of bfloat16 products (--use_bf16): ptb/bfloat16.py and the model."""

import dataclasses
import os
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import bfloat16
from ptb import kernels_test
from ptb import lstm
from ptb import plan as plan_lib
from ptb import testing
from ptb.bfloat16 import BFLOAT16, FLOAT32
from ptb.errors import UserError
from ptb.state import LSTMStateTuple
import ptb_word_lm
import ptb_word_lm_testing
import util

# A bfloat16 operand keeps 8 bits of mantissa: a product's relative error is
# a few 2^-8; over a sum of many, far less.
_TOLERANCE = 2e-2


def _bf16(x):
  """x rounded to bfloat16 and back, in numpy."""
  return tf.cast(tf.cast(x, tf.bfloat16), tf.float32).numpy()


def _relative_error(got, want):
  return np.linalg.norm(got - want) / np.linalg.norm(want)


def _cpuinfo(directory, flags, name="cpuinfo"):
  path = os.path.join(directory, name)
  with open(path, "w") as f:
    f.write("processor\t: 0\nflags\t\t: %s\n" % " ".join(flags))
  return path


class ProductsTest(tf.test.TestCase):

  def testMatmulMultipliesBfloat16OperandsInto32BitSums(self):
    rng = np.random.RandomState(0)
    a, b = rng.randn(5, 300).astype(np.float32), rng.randn(7, 300).astype(
        np.float32)
    got = self.evaluate(bfloat16.matmul(a, b, BFLOAT16, transpose_b=True))
    self.assertEqual(got.dtype, np.float32)
    # The rounded operands' exact product, then the output's own rounding
    # to bfloat16: within one step of it (sums in float32 differ in order).
    want = _bf16(_bf16(a).astype(np.float64) @ _bf16(b).T.astype(np.float64))
    self.assertAllClose(got, want, rtol=2 ** -7, atol=1e-3)
    # Not float32's product: the operands were rounded.
    self.assertGreater(np.abs(got - a @ b.T).max(), 1e-3)

  def testWeightGradientTransposedFirstByTheKernels(self):
    library = kernels_test.library_or_skip(self)
    del library
    rng = np.random.RandomState(2)
    # Small integers: bfloat16 holds them, and every sum of their products
    # is exact in any order, so both paths give the same bits.
    x = rng.randint(-4, 5, (30, 21)).astype(np.float32)      # [M, K]
    g = rng.randint(-4, 5, (30, 13)).astype(np.float32)      # [M, N]
    plain = bfloat16.matmul(x, g, BFLOAT16, transpose_a=True)
    first = tf.function(lambda: bfloat16.matmul(
        x, g, BFLOAT16, transpose_a=True, isa="avx512"))
    self.assertAllEqual(self.evaluate(first()), x.T @ g)
    self.assertAllEqual(self.evaluate(plain), x.T @ g)
    ops = {op.type for op in first.get_concrete_function().graph
           .get_operations()}
    self.assertIn("TransposeBf16", ops)
    # float32 products, or no kernels: tf.matmul's transpose_a as it is.
    for dtype_name, isa in ((FLOAT32, "avx512"), (BFLOAT16, None)):
      graph = tf.function(lambda d=dtype_name, i=isa: bfloat16.matmul(
          x, g, d, transpose_a=True, isa=i)).get_concrete_function().graph
      self.assertNotIn("TransposeBf16",
                       {op.type for op in graph.get_operations()})

  def testFloat32ProductsAreTensorFlowsOwn(self):
    rng = np.random.RandomState(1)
    a, b = rng.randn(4, 6).astype(np.float32), rng.randn(6, 3).astype(
        np.float32)
    self.assertAllEqual(self.evaluate(bfloat16.matmul(a, b, FLOAT32)),
                        self.evaluate(tf.matmul(a, b)))
    x = rng.randn(2, 4, 6).astype(np.float32)
    self.assertAllEqual(self.evaluate(bfloat16.tensordot(x, b, FLOAT32)),
                        self.evaluate(tf.tensordot(x, b, 1)))
    got = self.evaluate(bfloat16.tensordot(x, b, BFLOAT16))
    self.assertEqual(got.shape, (2, 4, 3))
    self.assertAllClose(got, x @ b, rtol=_TOLERANCE, atol=5e-2)


class CheckTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.dir = tmp.name

  def testRefusals(self):
    avx2 = _cpuinfo(self.dir, ["avx2", "fma"])
    cpu, gpu = ("/cpu:0",), ("/gpu:0",)
    cases = [((True, True, True, cpu, "basic"), "exclude each other"),
             ((True, False, True, gpu, "cudnn"), "--rnn_mode=BLOCK"),
             ((True, False, False, cpu, "basic"),
              "this CPU has no bfloat16 unit (AVX512_BF16 or AMX), so its "
              "bfloat16 products would run slower than float32; pass "
              "--force_bf16")]
    for args, fragment in cases:
      with self.subTest(args=args):
        with self.assertRaises(UserError) as e:
          bfloat16.check(*args, cpuinfo=avx2)
        self.assertIn(fragment, str(e.exception))
        self.assertEqual(e.exception.exit_code, 2)

  def testAcceptsUnitsForcedRunsAndGpus(self):
    avx2 = _cpuinfo(self.dir, ["avx2", "fma"])
    zen4 = _cpuinfo(self.dir, ["avx512f", "avx512_bf16"], "zen4")
    for args, cpuinfo in [((True, False, False, ("/cpu:0",), "block"), zen4),
                          ((True, False, True, ("/cpu:0",), "block"), avx2),
                          ((True, False, False, ("/gpu:0",), "block"), avx2),
                          ((False, True, False, ("/cpu:0",), "cudnn"), avx2)]:
      bfloat16.check(*args, cpuinfo=cpuinfo)  # no error


def _config():
  """TinyConfig over 9 steps (w_h transposed once), weights large enough
  that the products move the loss."""
  config = testing.TinyConfig()
  config.num_steps, config.init_scale = 9, 0.5
  return config


def _rows(config, seed=0):
  rng = np.random.RandomState(seed)
  return rng.randint(0, config.vocab_size,
                     size=(config.batch_size, config.num_steps + 1))


def _plan(config, products, chunk=None, kernels=None, packed_bf16=False,
          choices=plan_lib.RULES, **limits):
  """The training Step in `products`, its wavefront and thresholds forced.

  With packed_bf16, the recurrent products on the kernels' panels, in
  bfloat16 on PackPanelsBf16's (as where the CPU has VDPBF16PS); choices
  (a measured plan's) over the rules.
  """
  kernels = kernels or plan_lib.offered()
  if packed_bf16:
    kernels = dataclasses.replace(kernels, bf16=True)
    limits.update(kernel_min_hidden=0, kernel_min_batch=0, kernel_min_steps=0)
  plan = plan_lib.step(
      config, config.batch_size, config.num_steps, ("/cpu:0",), tf.float32,
      kernels,
      limits=testing.wavefront_limits(chunk, config.hidden_size)._replace(
          **limits), products=products, choices=choices)
  assert not packed_bf16 or plan.lstm.forward == plan_lib.KERNELS, plan
  return plan


def _dense_gradients(cost, variables):
  return [tf.convert_to_tensor(g) for g in tf.compat.v1.gradients(
      cost, variables)]


class ModelTest(tf.test.TestCase):
  """The model in bfloat16 against float32, from the same weights."""

  def _cost_and_gradients(self, rnn_mode, products, **plan_args):
    config = _config()
    config.rnn_mode = rnn_mode
    with tf.Graph().as_default():
      model = ptb_word_lm_testing.build_tiny_model(
          config, _rows(config), rnn_mode, plan=_plan(config, products,
                                                      **plan_args))
      variables = tf.compat.v1.trainable_variables()
      grads = _dense_gradients(model.cost, variables)
      with self.session() as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.local_variables_initializer()])
        return session.run([model.cost, grads]), [
            v.dtype.base_dtype for v in variables]

  def testLossAndEveryGradientWithinBfloat16sTolerance(self):
    no_kernels = plan_lib.Kernels(None, "none, for the test")
    paths = {
        "wavefront": ("basic", dict(chunk=2)),
        "layer, w_h transposed": ("basic", dict()),
        "layer, products swapped": ("basic", dict(kernel_min_steps=100,
                                                  swap_min_weight=0)),
        "block, its cell": ("block", dict()),
        "block without kernels": ("block", dict(kernels=no_kernels)),
        # VDPBF16PS's panels (the scalar unit where the CPU lacks it).
        "layer, bfloat16 panels": ("basic", dict(packed_bf16=True)),
        "block, bfloat16 panels": ("block", dict(packed_bf16=True)),
        # A measured plan's parts in different dtypes.
        "softmax alone in bfloat16": ("basic", dict(
            choices=plan_lib.Choices(lstm_products=FLOAT32))),
        "the LSTM alone in bfloat16": ("block", dict(
            choices=plan_lib.Choices(softmax_products=FLOAT32))),
    }
    for name, (mode, plan_args) in paths.items():
      if plan_args.get("packed_bf16") and plan_lib.offered().isa is None:
        continue  # no kernels here (kernels_test says why)
      with self.subTest(path=name):
        (cost32, grads32), _ = self._cost_and_gradients(mode, FLOAT32,
                                                        **plan_args)
        (cost16, grads16), dtypes = self._cost_and_gradients(
            mode, BFLOAT16, **plan_args)
        self.assertAllEqual(dtypes, [tf.float32] * len(dtypes))
        self.assertNotEqual(cost16, cost32)  # bfloat16 products ran
        self.assertAllClose(cost16, cost32, rtol=2e-3)
        for g16, g32 in zip(grads16, grads32):
          self.assertEqual(g16.dtype, np.float32)
          self.assertLess(_relative_error(g16, g32), _TOLERANCE)

  def testBlockWithoutKernelsTakesBasicsCellInBfloat16(self):
    config = _config()
    config.rnn_mode = "block"
    no_kernels = plan_lib.Kernels(None, "none, for the test")
    self.assertEqual(_plan(config, FLOAT32, kernels=no_kernels).lstm.cell,
                     plan_lib.BLOCK_LSTM)
    self.assertEqual(_plan(config, BFLOAT16, kernels=no_kernels).lstm.cell,
                     plan_lib.OPS_CELL)
    # A plan that asked BlockLSTM for bfloat16 products anyway is refused.
    block = _plan(config, FLOAT32, kernels=no_kernels).lstm
    self.assertEqual(set(block.paths), {plan_lib.BLOCK_LSTM})
    size, batch = config.hidden_size, config.batch_size
    with tf.Graph().as_default():
      with self.assertRaisesRegex(ValueError, "BlockLSTM cannot make bfloat16"):
        lstm.lstm_layer(
            dataclasses.replace(block, paths=block.paths[:1],
                                products=BFLOAT16),
            tf.zeros([config.num_steps, batch, size]),
            LSTMStateTuple(tf.zeros([batch, size]), tf.zeros([batch, size])),
            tf.zeros([2 * size, 4 * size]), tf.zeros([4 * size]))

  def testUpdateIsFloat32sGivenTheSameGradients(self):
    config = _config()
    # Dense updates: the gradients that the test fetches are the update's.
    plan = _plan(config, BFLOAT16, factor_max_rows=0)
    self.assertEqual(plan.updates, plan_lib.DENSE)
    with tf.Graph().as_default():
      model = ptb_word_lm_testing.build_tiny_model(config, _rows(config),
                                                   "basic", plan=plan)
      variables = tf.compat.v1.trainable_variables()
      grads = tf.compat.v1.gradients(model.cost, variables)
      with self.session() as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                      tf.compat.v1.local_variables_initializer()])
        model.assign_lr(session, 0.7)
        before, fetched = session.run([variables, grads])
        session.run(model.train_op)  # from the same (zero) state
        after = session.run(variables)
    # The float32 update of those gradients, in a graph of its own.
    with tf.Graph().as_default():
      weights = [tf.Variable(w) for w in before]
      given = [tf.IndexedSlices(tf.constant(g.values), tf.constant(g.indices),
                                tf.constant(g.dense_shape))
               if hasattr(g, "indices")  # the embedding's (sparse)
               else tf.constant(g) for g in fetched]
      update = util.train_op([given], weights, tf.constant(0.7),
                             config.max_grad_norm)
      with self.session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(update)
        want = session.run(weights)
    for got, w, b in zip(after, want, before):
      self.assertEqual(got.dtype, np.float32)
      self.assertAllEqual(got, w)
      self.assertFalse(np.array_equal(got, b))


class EntryPointTest(ptb_word_lm_testing.InProcessRunTest):

  def testRefusedWithoutBfloat16UnitsUnlessForced(self):
    path = _cpuinfo(self.tmp, ["avx2", "fma"])
    with mock.patch.object(bfloat16, "CPUINFO", path):
      _, _, stop = ptb_word_lm_testing.run_in_process(
          self.args() + ["--use_bf16"])
      self.assertIsInstance(stop, UserError)
      self.assertIn("no bfloat16 unit", str(stop))
      _, _, stop = ptb_word_lm_testing.run_in_process(
          self.args() + ["--use_bf16", "--force_bf16", "--use_fp16"])
      self.assertIn("exclude each other", str(stop))
      out, err, stop = ptb_word_lm_testing.run_in_process(
          self.args() + ["--use_bf16", "--force_bf16"])
    self.assertIsNone(stop, err)
    self.assertIn("products=bfloat16", err)
    self.assertRegex(out, r"Test Perplexity: \d+\.\d{3}\n")


if __name__ == "__main__":
  tf.test.main()
