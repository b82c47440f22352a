"""Tests of the vector kernels (recurrent products, softmax) and of their use.

Building, loading (op registration), the cache and the fallback after a
failed build are tested on any CPU with a C++ compiler: the library is
compiled without -mavx2 or -mavx512f, so it builds and loads everywhere. The
tests that run vector code (PanelMatMul, SoftmaxCrossEntropy, the model with
the kernels) run once for every width the CPU can execute (AVX-512 and AVX2
on an AVX-512 CPU), through the ops' attribute isa or PTB_KERNEL_ISA; they
skip only on a CPU with neither AVX-512 nor AVX2 and FMA.
PTB_TEST_NO_AVX512=1 runs this module as on a CPU with AVX2 but no AVX-512
(`plan.cpu_isas` sees no avx512 flag, PTB_KERNEL_ISA=avx2), to check from
a machine with AVX-512 what runs there. Whether the model uses the kernels
is the plan's choice (plan_test.py); here the model's layers are built with
plans that use them.
"""

import contextlib
import itertools
import os
import shutil
import stat
import subprocess
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import kernel_offer
from ptb import kernels
from ptb import lstm
from ptb import plan as plan_lib
from ptb import softmax
from ptb import testing
from ptb.config import BASIC, BLOCK
from ptb.state import LSTMStateTuple

_NO_VECTORS = ("the CPU has neither AVX-512 nor AVX2 with FMA, one of which "
               "running these ops needs")
_NO_COMPILER = "no C++ compiler to build the kernels with"
_OPS = ("pack_panels", "panel_mat_mul", "softmax_cross_entropy", "fma_peak",
        "bf16_peak", "apply_outer_product", "stream_triad", "lstm_cell",
        "pack_panels_bf16", "panel_mat_mul_bf16", "transpose_bf16",
        "sum_as_tf15")
_NO_BF16 = "no CPU with AVX512_BF16/AMX here"
_read_flags = kernel_offer.cpu_flags
_module = {}


def _flags_without_avx512(cpuinfo):
  """This CPU's flags less AVX-512's (other files' flags as they are)."""
  flags = _read_flags(cpuinfo)
  if cpuinfo == "/proc/cpuinfo":
    flags = {f for f in flags if not f.startswith("avx512")}
  return flags


def _environ(**values):
  """Patches os.environ: a value of None removes the variable."""
  patch = mock.patch.dict(os.environ)
  patch.start()
  for name, value in values.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  return patch


def setUpModule():
  # One build for the whole module: in the pytest run's directory
  # (conftest.py), or alone in one of its own.
  _module["dir"] = os.environ.get("PTB_KERNEL_DIR")
  if not _module["dir"]:
    _module["own"] = os.environ["PTB_KERNEL_DIR"] = tempfile.mkdtemp(
        prefix="ptb_kernels_")
    _module["dir"] = _module["own"]
  if os.environ.get("PTB_TEST_NO_AVX512") == "1":
    # The ops' own choice (isa auto) follows PTB_KERNEL_ISA, not the patch.
    _module["cpu"] = mock.patch.object(kernel_offer, "cpu_flags",
                                       side_effect=_flags_without_avx512)
    _module["cpu"].start()
    _module["env"] = _environ(PTB_KERNEL_ISA="avx2")
  kernel_offer.forget_offered()


def tearDownModule():
  for name in ("env", "cpu"):
    if name in _module:
      _module.pop(name).stop()
  _module.pop("dir")
  if "own" in _module:
    os.environ.pop("PTB_KERNEL_DIR", None)
    # A library loaded from here stays loaded; Linux keeps its pages.
    shutil.rmtree(_module.pop("own"), ignore_errors=True)
  kernel_offer.forget_offered()


def skip_without_compiler(test):
  if not kernels.compiler_found():
    test.skipTest(_NO_COMPILER)


def library_or_skip(test):
  """The op library, built and loaded whatever the CPU; skips without g++."""
  skip_without_compiler(test)
  return kernels.load_library()


def kernels_or_skip(test):
  """The op library where its ops can run; skips without a width or g++."""
  if not kernel_offer.cpu_isas():
    test.skipTest(_NO_VECTORS)
  skip_without_compiler(test)
  library = kernels.load()
  test.assertIsNotNone(library)
  return library


def widths_or_skip(test):
  """The op library and every width this CPU runs; skips as kernels_or_skip.

  Each test of the ops runs once per width: `with_width` around each run.
  """
  library = kernels_or_skip(test)
  return library, kernel_offer.cpu_isas()


@contextlib.contextmanager
def with_width(test, isa):
  """A subtest in which PTB_KERNEL_ISA is isa, for the ops built in it.

  Ops in graphs built there take their width from it; eager ops are cached
  by their attributes, so eager calls pass isa too.
  """
  patch = _environ(PTB_KERNEL_ISA=isa)
  try:
    with test.subTest(isa=isa):
      yield
  finally:
    patch.stop()


class PackPanelsTest(tf.test.TestCase):

  def testPanelsHoldColumnBlocksPaddedWithZeros(self):
    # PackPanels is plain C++, without vector code: it runs on any CPU.
    kernels = library_or_skip(self)
    b = np.arange(3 * 40, dtype=np.float32).reshape(3, 40)   # [K, N]
    for w, transpose in ((b, False), (b.T.copy(), True)):
      panels = self.evaluate(kernels.pack_panels(w, transpose=transpose))
      self.assertEqual(panels.shape, (2, 3, 32))
      self.assertAllEqual(panels[0], b[:, :32])
      self.assertAllEqual(panels[1, :, :8], b[:, 32:])
      self.assertAllEqual(panels[1, :, 8:], np.zeros((3, 24)))
      self.assertEqual(panels[1, 2, 7], 119.0)   # b[2, 39]


class PanelMatMulTest(tf.test.TestCase):

  def testEqualsMatMulPlusAddendOnOddShapes(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        rng = np.random.RandomState(0)
        # Rows: under, at and over the 10-row (AVX-512) and 3-row (AVX2)
        # tiles; columns: under, at and over the 32-column panel and its
        # vectors of 16 and 8; K: any.
        for m, k, n in ((1, 1, 1), (3, 5, 16), (10, 37, 31), (13, 64, 33),
                        (20, 650, 148), (20, 148, 37)):
          a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
          b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
          x = rng.uniform(-1, 1, (m, n)).astype(np.float32)
          want = a.astype(np.float64) @ b + x
          for w, transpose in ((b, False), (b.T.copy(), True)):
            got = self.evaluate(kernels.panel_mat_mul(
                a, kernels.pack_panels(w, transpose=transpose), x, isa=isa))
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-5,
                                msg="%s transpose=%s %s" % (
                                    (m, k, n), transpose, isa))

  def testMismatchedShapesAreAnError(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        panels = kernels.pack_panels(np.ones((4, 40), np.float32),
                                     transpose=False)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "shapes do not match"):
          self.evaluate(kernels.panel_mat_mul(
              np.ones((2, 5), np.float32), panels,
              np.ones((2, 40), np.float32), isa=isa))


def bf16_bits(x):
  """float32 `x` rounded to bfloat16 as the kernels round it: the 16 bits.

  To nearest, ties to even; a NaN to a quiet NaN; a denormal to a zero of
  its sign.
  """
  b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  rounded = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
  rounded = np.where((b & 0x7F800000) == 0, (b >> 16) & 0x8000, rounded)
  rounded = np.where((b & 0x7FFFFFFF) > 0x7F800000, (b >> 16) | 0x40,
                     rounded)
  return rounded.astype(np.uint32)


def bf16_values(x):
  """The float32 values of bf16_bits(x)."""
  return (bf16_bits(x) << 16).astype(np.uint32).view(np.float32)


def reference_bf16_product(a, b, addend):
  """a @ b + addend as VDPBF16PS sums it, written afresh in numpy.

  a and b rounded to bfloat16; for each pair of k (zero beyond K), the odd
  k's product added to the float32 sum, then the even k's, each rounded to
  float32 (the products of two bfloat16s are exact in float32: the inputs
  here keep them normal); then the addend.
  """
  a, b = bf16_values(a), bf16_values(b)
  k = a.shape[1]
  if k % 2:
    a = np.pad(a, ((0, 0), (0, 1)))
    b = np.pad(b, ((0, 1), (0, 0)))
  acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
  for i in range(0, a.shape[1], 2):
    for j in (i + 1, i):
      acc = (acc + a[:, j:j + 1] * b[j:j + 1, :]).astype(np.float32)
  return (acc + addend).astype(np.float32)


class PanelMatMulBf16Test(tf.test.TestCase):
  """The bfloat16 panels, bit for bit against reference_bf16_product.

  The scalar unit (the instruction's arithmetic in scalar code) runs on
  any CPU, so the packing, the tails and the indexing are tested
  everywhere; the VDPBF16PS unit where the CPU has it.
  """

  def _units(self):
    units = ["scalar"]
    if "avx512_bf16" in kernels.bf16_units():
      units.append("avx512_bf16")
    return units

  def testPanelsHoldPairsOfRoundedColumnsPaddedWithZeros(self):
    library = library_or_skip(self)
    rng = np.random.RandomState(1)
    b = rng.uniform(-1, 1, (5, 40)).astype(np.float32)   # [K, N]
    for (w, transpose), unit in itertools.product(
        ((b, False), (b.T.copy(), True)), self._units()):
      panels = self.evaluate(library.pack_panels_bf16(
          w, transpose=transpose, unit=unit))
      self.assertEqual(panels.shape, (2, 3, 32))
      words = panels.view(np.uint32)
      padded = np.zeros((6, 64), np.float32)
      padded[:5, :40] = b
      bits = bf16_bits(padded)
      for p in range(2):
        cols = slice(32 * p, 32 * p + 32)
        # The even k in the low half, the odd k in the high half.
        self.assertAllEqual(words[p] & 0xFFFF, bits[0::2, cols])
        self.assertAllEqual(words[p] >> 16, bits[1::2, cols])
      self.assertAllEqual(words[1, :, 8:], np.zeros((3, 24), np.uint32))
      self.assertAllEqual(words[:, 2] >> 16, np.zeros((2, 32), np.uint32))

  def testRoundingToNearestEvenNanAndDenormals(self):
    values = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20,
                       -2.5, np.nan, 1e-40, -1e-40, 3.4e38], np.float32)
    self.assertAllEqual(bf16_bits(values), [
        0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x7FC0, 0, 0x8000, 0x7F80])
    library = library_or_skip(self)
    for unit in self._units():
      panels = self.evaluate(library.pack_panels_bf16(
          values[None, :], transpose=False, unit=unit))
      self.assertAllEqual(panels.view(np.uint32)[0, 0, :9] & 0xFFFF,
                          bf16_bits(values))
      # The rows of a are rounded as the panels are: a column of them
      # times 1, plus 0 (which turns -0 into 0).
      got = self.evaluate(library.panel_mat_mul_bf16(
          values[:, None], library.pack_panels_bf16(
              np.ones((1, 1), np.float32), transpose=False, unit=unit),
          np.zeros((9, 1), np.float32), unit=unit))[:, 0]
      want = bf16_values(values) + np.float32(0)
      self.assertAllEqual(np.isnan(got), np.isnan(want))
      self.assertAllEqual(got[~np.isnan(got)].view(np.uint32),
                          want[~np.isnan(want)].view(np.uint32))

  def testEqualsTheReferenceBitForBitOnOddShapes(self):
    library = library_or_skip(self)
    rng = np.random.RandomState(0)
    # Rows under, at and over the 10-row tile; columns under, at and over
    # the panel and its vectors of 16; K odd and even.
    for m, k, n in ((1, 1, 1), (3, 7, 16), (10, 2, 31), (11, 64, 33),
                    (20, 65, 100), (21, 130, 70)):
      a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
      b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
      x = rng.uniform(-1, 1, (m, n)).astype(np.float32)
      want = reference_bf16_product(a, b, x)
      # Within bfloat16's rounding of the float64 product.
      self.assertAllClose(want, a.astype(np.float64) @ b + x,
                          atol=0.02 * np.sqrt(k) + 1e-6)
      for w, transpose in ((b, False), (b.T.copy(), True)):
        for unit in self._units():
          panels = library.pack_panels_bf16(w, transpose=transpose, unit=unit)
          with self.subTest(shape=(m, k, n), transpose=transpose, unit=unit):
            got = self.evaluate(library.panel_mat_mul_bf16(a, panels, x,
                                                           unit=unit))
            self.assertAllEqual(got.view(np.uint32), want.view(np.uint32))

  def testTransposeRoundsAsThePanelsOnOddShapes(self):
    library = library_or_skip(self)
    rng = np.random.RandomState(2)
    # Under, at and over the op's 64 x 64 tiles and its vectors of 16.
    for m, k in ((1, 1), (3, 17), (64, 64), (65, 130), (130, 63)):
      a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
      a.flat[:3] = (1e-40, np.nan, 1.0 + 2**-8)  # a denormal, a NaN, a tie
      for unit in self._units():
        with self.subTest(shape=(m, k), unit=unit):
          got = self.evaluate(library.transpose_bf16(a, unit=unit))
          self.assertEqual(got.dtype, tf.bfloat16.as_numpy_dtype)
          self.assertAllEqual(got.view(np.uint16), bf16_bits(a.T))
    with self.assertRaisesRegex(Exception, "must be a matrix|rank 2"):
      self.evaluate(library.transpose_bf16(np.ones(3, np.float32)))

  def testTheVectorUnitSkipsWhereTheCpuLacksIt(self):
    library = library_or_skip(self)
    if "avx512_bf16" in kernels.bf16_units():
      self.skipTest("this CPU has AVX512_BF16: the unit runs above")
    with self.assertRaisesRegex(Exception, "unit avx512_bf16 needs a CPU"):
      self.evaluate(library.panel_mat_mul_bf16(
          np.ones((1, 2), np.float32),
          library.pack_panels_bf16(np.ones((2, 3), np.float32),
                                   transpose=False),
          np.zeros((1, 3), np.float32), unit="avx512_bf16"))


class ApplyOuterProductTest(tf.test.TestCase):

  def _apply(self, library, isa, w0, x, g, alpha, read_first=False):
    """w0 after ApplyOuterProduct; with read_first, also a read from before."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      var = tf.Variable(w0)
      old = var.read_value()
      with tf.control_dependencies([old] if read_first else []):
        update = library.apply_outer_product(var.handle, x, g, alpha, isa=isa)
      sess.run(var.initializer)
      got_old = sess.run([old, update])[0] if read_first else None
      sess.run(update) if not read_first else None
      return sess.run(var), got_old

  def testEqualsDenseUpdateOnOddShapes(self):
    library, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        rng = np.random.RandomState(4)
        # Rows of w: under, at and over the tiles (AVX2 4 rows, AVX-512 6)
        # and their blocks (24 and 36 rows); columns: under, at and over a
        # tile's 24 (AVX2) and 64 (AVX-512) and their vectors; M from 1.
        for m, k, n in ((1, 1, 1), (2, 3, 7), (5, 7, 37), (40, 25, 24),
                        (3, 37, 65), (17, 50, 130)):
          for shape in ((k, n), (n,)) if k == 1 else ((k, n),):
            w0 = rng.uniform(-1, 1, shape).astype(np.float32)
            x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            g = rng.uniform(-1, 1, (m, n)).astype(np.float32)
            got, _ = self._apply(library, isa, w0, x, g, -0.5)
            want = w0 - 0.5 * (x.astype(np.float64).T @ g).reshape(shape)
            self.assertAllClose(got, want, rtol=1e-5, atol=1e-6,
                                msg="%s %s %s" % ((m, k, n), shape, isa))

  def testAReadStillHeldKeepsItsValues(self):
    library, widths = widths_or_skip(self)
    w0 = np.ones((3, 30), np.float32)
    x, g = np.ones((2, 3), np.float32), np.ones((2, 30), np.float32)
    for isa in widths:
      with with_width(self, isa):
        got, old = self._apply(library, isa, w0, x, g, 1.0, read_first=True)
        self.assertAllEqual(old, w0)
        self.assertAllEqual(got, w0 + 2)

  def testShapesThatAreNotTheProductsAreAnError(self):
    library, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"is not x\^T @ g"):
          self._apply(library, isa, np.ones((3, 4), np.float32),
                      np.ones((2, 3), np.float32),
                      np.ones((2, 5), np.float32), 1.0)


class StreamTriadTest(tf.test.TestCase):

  def testTimesTheTriadOfEveryElement(self):
    library, isas = widths_or_skip(self)
    # The op checks every element of a = b + 3 c itself and fails if one is
    # wrong: sizes with a tail after the 4-vector loop, blocks of unequal
    # length across threads, and fewer elements than threads.
    for isa in isas:
      for n in (1, 5, (1 << 16) + 13):
        with self.subTest(isa=isa, n=n):
          seconds = self.evaluate(library.stream_triad(
              tf.constant(n, tf.int64), tf.constant(2, tf.int64), isa=isa))
          self.assertGreater(seconds, 0)
          self.assertLess(seconds, 1)
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "> 0"):
      self.evaluate(library.stream_triad(tf.constant(0, tf.int64),
                                         tf.constant(1, tf.int64)))


class FmaPeakTest(tf.test.TestCase):

  def testCountsEveryThreadsChainsAndComputesThem(self):
    # (lanes, chains) per width, as kernels.cc's V::kWidth and V::kChains.
    shapes = {"avx512": (16, 16), "avx2": (8, 12)}
    kernels, widths = widths_or_skip(self)
    m, a = np.float32(0.999999), np.float32(1e-6)
    for isa in widths:
      with with_width(self, isa):
        lanes, chains = shapes[isa]
        flops, checksum = self.evaluate(kernels.fma_peak(3, isa=isa))
        per_thread = 3 * 2 * lanes * chains
        threads = flops / per_thread
        self.assertEqual(threads, int(threads))
        self.assertGreaterEqual(threads, 1)
        # Each chain i starts at 0.001 i and takes three steps x m + a.
        x = np.float32(0.001) * np.arange(chains, dtype=np.float32)
        for _ in range(3):
          x = (x.astype(np.float64) * m + a).astype(np.float32)
        self.assertAllClose(checksum, threads * lanes * x.sum(), rtol=1e-6)
        self.assertEqual(self.evaluate(kernels.fma_peak(0, isa=isa))[0], 0)


def _cpuinfo(directory, flags):
  """A cpuinfo file of two processors with these flags; returns its path."""
  path = os.path.join(directory, "cpuinfo-%d" % len(os.listdir(directory)))
  with open(path, "w") as f:
    for processor in range(2):
      f.write("processor\t: %d\nmodel name\t: a CPU\nflags\t\t: %s\n\n"
              % (processor, flags))
  return path


class Bf16UnitsTest(tf.test.TestCase):

  def testUnitsTheFlagsListInAutosOrder(self):
    common = "fpu sse sse2 avx fma avx2 avx512f avx512bw"
    with tempfile.TemporaryDirectory() as tmp:
      for flags, units in (
          # Sapphire Rapids: AMX and AVX512_BF16.
          (common + " avx512_bf16 amx_bf16 amx_tile amx_int8",
           ("amx", "avx512_bf16")),
          # Zen 4: AVX512_BF16 without AMX.
          (common + " avx512_bf16 avx512_vnni", ("avx512_bf16",)),
          # AVX2 only (as Zen 2 and 3).
          ("fpu sse sse2 avx fma avx2", ()),
          # Half of AMX is none of it.
          (common + " amx_tile", ())):
        with self.subTest(units=units, flags=flags[-30:]):
          self.assertEqual(kernels.bf16_units(_cpuinfo(tmp, flags)), units)
      self.assertEqual(kernels.bf16_units(os.path.join(tmp, "missing")), ())


class Bf16PeakTest(tf.test.TestCase):

  # FLOPs of an iteration on one thread (2 a product), as kernels.cc counts
  # them: 16 chains of VDPBF16PS (16 lanes x 2 products), and 4 accumulator
  # tiles of TDPBF16PS (16 x 16 floats x 32 products).
  _FLOPS = {"avx512_bf16": 16 * 16 * 2 * 2, "amx": 4 * 16 * 16 * 32 * 2}

  def _expected_sum(self, unit, iterations):
    """A thread's checksum: every product is 2^-10 x 2^-10, exactly."""
    product = 2.0 ** -20
    if unit == "avx512_bf16":
      # Chain i starts at i / 1024 in its 16 lanes; 2 products an iteration.
      starts = np.arange(16) / 1024.0
      return 16 * np.sum(starts + iterations * 2 * product)
    # 4 tiles of 16 x 16 floats from 0, 32 products an iteration.
    return 4 * 16 * 16 * iterations * 32 * product

  def testRefusesTheUnitsThisCpuLacks(self):
    library = library_or_skip(self)
    present = kernels.bf16_units()
    refusals = {
        "amx": "Bf16Peak: unit amx needs a CPU with AMX-BF16 "
               r"\(this one has none\)",
        "avx512_bf16": "Bf16Peak: unit avx512_bf16 needs a CPU with "
                       r"AVX512_BF16 \(this one has none\)",
        "auto": "Bf16Peak: unit auto needs a CPU with AMX-BF16 or "
                r"AVX512_BF16 \(this one has neither\)"}
    # auto refuses only where both are absent.
    absent = [unit for unit in ("amx", "avx512_bf16") if unit not in present]
    absent += [] if present else ["auto"]
    if not absent:
      self.skipTest("this CPU has every bfloat16 unit")
    for unit in absent:
      with self.subTest(unit=unit):
        # The whole message, which holds no line break: one line.
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    refusals[unit]):
          self.evaluate(library.bf16_peak(3, unit=unit))

  def testCountsTheFlopsOfTheUnitsThisCpuHas(self):
    present = kernels.bf16_units()
    if not present:
      self.skipTest(_NO_BF16)
    library = library_or_skip(self)
    for unit in present + ("auto",):
      with self.subTest(unit=unit):
        runs = present[0] if unit == "auto" else unit
        flops, checksum = self.evaluate(library.bf16_peak(3, unit=unit))
        threads = flops / (3 * self._FLOPS[runs])
        self.assertEqual(threads, int(threads))
        self.assertGreaterEqual(threads, 1)
        self.assertTrue(np.isfinite(checksum))
        self.assertAllClose(checksum,
                            threads * self._expected_sum(runs, 3), rtol=1e-6)
        self.assertEqual(
            self.evaluate(library.bf16_peak(0, unit=unit))[0], 0)


def _xent_reference(logits, b, labels):
  """Loss and softmax - onehot of logits + b: the sum rounded to float32, as
  the op does (for logits near 1e4 its rounding alone moves p by 1e-3), the
  rest in float64."""
  z = (logits + b).astype(np.float64)
  top = z.max(axis=1, keepdims=True)
  e = np.exp(z - top)
  rows = np.arange(len(labels))
  loss = np.log(e.sum(axis=1)) + top[:, 0] - z[rows, labels]
  d = e / e.sum(axis=1, keepdims=True)
  d[rows, labels] -= 1.0
  return loss, d


class SoftmaxCrossEntropyTest(tf.test.TestCase):

  def testHandMadeRows(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
        b = np.array([0.0, 0.5, -0.5], np.float32)
        labels = np.array([2, 0], np.int32)
        loss, d = self.evaluate(
            kernels.softmax_cross_entropy(logits, b, labels, isa=isa))
        # Row 0: z = [1, 2.5, 2.5], target 2.5; row 1: z = [0, 0.5, -0.5].
        s0 = np.exp(1.0) + 2 * np.exp(2.5)
        s1 = 1.0 + np.exp(0.5) + np.exp(-0.5)
        self.assertAllClose(loss, [np.log(s0) - 2.5, np.log(s1)], rtol=1e-6)
        self.assertAllClose(
            d, [[np.exp(1.0) / s0, np.exp(2.5) / s0, np.exp(2.5) / s0 - 1.0],
                [1.0 / s1 - 1.0, np.exp(0.5) / s1, np.exp(-0.5) / s1]],
            rtol=1e-6, atol=1e-7)

  def testOddShapesAndLargeLogits(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        rng = np.random.RandomState(5)
        # Vocabularies under, at and over 16 and 8 lanes; labels anywhere,
        # the last column included; logits far from 0 (the max is subtracted).
        for n, v, offset in ((1, 1, 0.0), (3, 5, 0.0), (2, 16, 80.0),
                             (4, 17, -300.0), (7, 40, 1e4)):
          logits = (rng.uniform(-20, 20, (n, v)) + offset).astype(np.float32)
          b = rng.uniform(-1, 1, v).astype(np.float32)
          labels = rng.randint(0, v, n).astype(np.int32)
          labels[-1] = v - 1
          loss, d = self.evaluate(
              kernels.softmax_cross_entropy(logits, b, labels, isa=isa))
          want_loss, want_d = _xent_reference(logits, b, labels)
          self.assertAllClose(loss, want_loss, rtol=1e-5, atol=2e-5,
                              msg=str((n, v, isa)))
          self.assertAllClose(d, want_d, rtol=1e-5, atol=1e-6,
                              msg=str((n, v, isa)))

  def testNanInARowMakesItsLossNan(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        logits = np.zeros((2, 20), np.float32)
        logits[0, 17] = np.nan
        loss, d = self.evaluate(kernels.softmax_cross_entropy(
            logits, np.zeros(20, np.float32), np.array([3, 3], np.int32),
            isa=isa))
        self.assertTrue(np.isnan(loss[0]))
        self.assertTrue(np.isnan(d[0]).all())
        self.assertAllClose(loss[1], np.log(20.0), rtol=1e-6)

  def testLabelOutsideTheVocabularyIsAnError(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"label 3 of row 1 is outside \[0, 3\)"):
          self.evaluate(kernels.softmax_cross_entropy(
              np.zeros((2, 3), np.float32), np.zeros(3, np.float32),
              np.array([0, 3], np.int32), isa=isa))


def _cell_reference(gates, cs_prev):
  """LstmCell's seven outputs in float64 numpy."""
  i, j, f, o = np.split(gates.astype(np.float64), 4, axis=1)
  sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))
  i, ci, f, o = sigmoid(i), np.tanh(j), sigmoid(f), sigmoid(o)
  cs = ci * i + cs_prev * f
  co = np.tanh(cs)
  return [i, cs, f, o, ci, co, co * o]


class LstmCellTest(tf.test.TestCase):

  def testEqualsTheCellOnOddShapesAndSaturatedGates(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        rng = np.random.RandomState(7)
        # Hidden sizes under, at and over 8 and 16 lanes; gates far out in
        # both directions, where sigmoid and tanh saturate.
        for b, h in ((1, 1), (3, 5), (2, 16), (4, 17), (20, 1000)):
          gates = rng.uniform(-6, 6, (b, 4 * h)).astype(np.float32)
          gates[0, ::3] = 95.0
          gates[-1, 1::3] = -120.0
          cs_prev = rng.uniform(-2, 2, (b, h)).astype(np.float32)
          got = self.evaluate(kernels.lstm_cell(gates, cs_prev, isa=isa))
          for name, g, w in zip(("i", "cs", "f", "o", "ci", "co", "h"), got,
                                _cell_reference(gates, cs_prev)):
            self.assertAllClose(g, w, rtol=1e-6, atol=1e-6,
                                msg="%s %s %s" % (name, (b, h), isa))

  def testNanGateMakesItsOutputsNan(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        gates = np.zeros((1, 8), np.float32)
        gates[0, 7] = np.nan   # unit 1's output gate (blocks i, j, f, o)
        got = self.evaluate(kernels.lstm_cell(
            gates, np.ones((1, 2), np.float32), isa=isa))
        self.assertTrue(np.isnan(got[3][0, 1]) and np.isnan(got[6][0, 1]))
        # Unit 0: i = f = o = 1/2, ci = 0, so cs = 1/2 and h = tanh(1/2) / 2.
        self.assertAllClose(got[6][0, 0], 0.5 * np.tanh(0.5), rtol=1e-6)
        self.assertFalse(np.isnan(got[1]).any())

  def testMismatchedShapesAreAnError(self):
    kernels, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "shapes do not match"):
          self.evaluate(kernels.lstm_cell(np.zeros((2, 12), np.float32),
                                          np.zeros((2, 4), np.float32),
                                          isa=isa))


class SoftmaxLossPathsTest(tf.test.TestCase):
  """The softmax layer gives the same numbers with the kernel as without."""

  def testFusedEqualsTensorFlowOpsWithGradients(self):
    _, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        rng = np.random.RandomState(6)
        values = [rng.uniform(-2, 2, s).astype(np.float32)
                  for s in ((13, 9), (9, 37), (37,))]
        labels = rng.randint(0, 37, 13).astype(np.int32)
        d_loss = rng.uniform(0, 2, 13).astype(np.float32)
        results = []
        for plan in (plan_lib.Softmax(plan_lib.OPS, plan_lib.PLAIN, None),
                     plan_lib.Softmax(plan_lib.KERNEL, plan_lib.PLAIN, isa)):
          with tf.Graph().as_default() as graph, \
              tf.compat.v1.Session() as sess:
            args = [tf.constant(v) for v in values]
            loss = softmax.softmax_loss(plan, *args, tf.constant(labels))
            grads = tf.compat.v1.gradients(loss * d_loss, args)
            results.append(sess.run([loss] + grads))
            fused = [op for op in graph.get_operations()
                     if op.type == "SoftmaxCrossEntropy"]
            self.assertEqual([op.get_attr("isa").decode() for op in fused],
                             [isa] if plan.loss == plan_lib.KERNEL else [])
        for k, (got, want) in enumerate(zip(results[1], results[0])):
          self.assertAllClose(got, want, rtol=1e-5, atol=1e-6, msg=str(k))


def _count_ops(graph, op_type):
  return sum(op.type == op_type for op in graph.get_operations())


class ModelProductsTest(tf.test.TestCase):
  """The layers give the same numbers with the kernels as with tf.matmul."""

  def _stack(self, rnn_mode, chunk, values, isa):
    """Outputs, final states and gradients of a 2-layer stack; op count.

    With the kernels' width `isa`, the plan takes them at any size; with
    None, tf.matmul and TensorFlow's cell.
    """
    x, states, kernels, biases, dy = values
    steps, batch, size = x.shape
    limits = testing.wavefront_limits(chunk, size)._replace(
        kernel_min_hidden=0, kernel_min_steps=0)
    plan = plan_lib.lstm(rnn_mode, 2, size, batch, steps, isa, limits=limits)
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
      x = tf.constant(x)
      states = [LSTMStateTuple(tf.constant(c), tf.constant(h))
                for c, h in states]
      kernels = [tf.constant(k) for k in kernels]
      biases = [tf.constant(b) for b in biases]
      outputs, finals = lstm.lstm_stack(plan, x, states, kernels, biases)
      loss = tf.reduce_sum(outputs * dy) + sum(
          tf.reduce_sum(s.c) + 2 * tf.reduce_sum(s.h) for s in finals)
      wrt = [x] + [s.h for s in states] + kernels + biases
      results = sess.run([outputs] + [list(s) for s in finals] +
                         tf.compat.v1.gradients(loss, wrt))
      self._cells = _count_ops(graph, "LstmCell")
      self.assertEqual(
          {op.get_attr("isa").decode() for op in graph.get_operations()
           if op.type in ("LstmCell", "PanelMatMul")},
          {isa} if isa else set())
      return results, _count_ops(graph, "PanelMatMul")

  def testBasicAndBlockWithKernelsEqualWithout(self):
    _, widths = widths_or_skip(self)
    for isa in widths:
      with with_width(self, isa):
        rng = np.random.RandomState(3)
        # Hidden 37: 4H = 148 columns and H = 37 both end in a partial panel;
        # batch 12: one 10-row tile and one of 2 rows (AVX2: four of 3).
        steps, batch, size = 5, 12, 37
        u = lambda *s: rng.uniform(-1, 1, size=s).astype(np.float32)
        values = (u(steps, batch, size),
                  [(u(batch, size), u(batch, size)) for _ in range(2)],
                  [u(2 * size, 4 * size) * 0.3 for _ in range(2)],
                  [u(4 * size) for _ in range(2)], u(steps, batch, size))
        # The reference: tf.matmul's products and TensorFlow's cell.
        want, count = self._stack(BASIC, None, values, None)
        self.assertEqual(count, 0)
        for mode, chunk in ((BASIC, 2), (BASIC, None), (BLOCK, 2),
                            (BLOCK, None)):
          got, count = self._stack(mode, chunk, values, isa)
          # One product per step and layer, forward and backward; BLOCK's
          # cell is the fused LstmCell, once per step and layer.
          self.assertEqual(count, 2 * 2 * steps, msg=mode)
          self.assertEqual(self._cells, 2 * steps if mode == BLOCK else 0,
                           msg=mode)
          for k, (g, w) in enumerate(zip(got, want)):
            self.assertAllClose(g, w, rtol=1e-5, atol=1e-5,
                                msg="%s chunk %s result %d" % (mode, chunk, k))

  def testBlockRunsTheCellItsPlanNames(self):
    # The kernels' LstmCell where the plan offers them (float32 on a CPU),
    # BlockLSTM where it does not (GPUs, float16, no kernels).
    kernels_or_skip(self)
    for isa, fused in ((kernel_offer.cpu_isas()[0], True), (None, False)):
      for chunk in (2, None):
        plan = plan_lib.lstm(BLOCK, 2, 5, 3, 4, isa,
                             limits=testing.wavefront_limits(chunk, 5))
        # Built, not run.
        with tf.Graph().as_default() as graph:
          x = tf.zeros([4, 3, 5])
          states = [LSTMStateTuple(tf.zeros([3, 5]), tf.zeros([3, 5]))] * 2
          lstm.lstm_stack(plan, x, states, [tf.zeros([10, 20])] * 2,
                          [tf.zeros([20])] * 2)
        self.assertEqual(_count_ops(graph, "LstmCell"), 8 if fused else 0,
                         msg="%s chunk %s" % (isa, chunk))
        self.assertEqual(_count_ops(graph, "BlockLSTM"), 0 if fused else 2,
                         msg="%s chunk %s" % (isa, chunk))


class LoadTest(tf.test.TestCase):
  """Building and loading; what the model may use is kernel_offer.offer's."""

  def testLoadKeepsTheLibraryOrGivesNone(self):
    skip_without_compiler(self)
    state = kernels._state  # pylint: disable=protected-access
    self.addCleanup(state.update, dict(state))
    state["library"] = None
    library = kernels.load()
    self.assertTrue(hasattr(library, "panel_mat_mul"))
    with mock.patch.object(kernels, "load_library",
                           side_effect=AssertionError("loaded again")):
      self.assertIs(kernels.load(), library)
    state["library"] = None
    with mock.patch.object(kernels, "load_library",
                           side_effect=RuntimeError("no compiler")):
      self.assertIsNone(kernels.load())

  def testOpsTakeTheirWidthFromTheEnvironment(self):
    # In graphs: each session constructs its ops, which read PTB_KERNEL_ISA
    # then (isa auto); an explicit isa overrides it.
    kernels_or_skip(self)
    library = kernels.load_library()
    for wanted, isa, error in (("avx1024", "auto", "PTB_KERNEL_ISA is "
                                '"avx1024", not avx512 or avx2'),
                               ("avx1024", kernel_offer.cpu_isas()[-1], None)):
      patch = _environ(PTB_KERNEL_ISA=wanted)
      try:
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
          ops = [library.panel_mat_mul(
                     tf.ones([2, 3]), library.pack_panels(
                         tf.ones([3, 5]), transpose=False),
                     tf.ones([2, 5]), isa=isa),
                 library.softmax_cross_entropy(
                     tf.zeros([2, 3]), tf.zeros([3]), tf.zeros([2], tf.int32),
                     isa=isa)[0]]
          for op in ops:
            if error is None:
              self.assertAllClose(sess.run(op), np.full(op.shape, 4.0)
                                  if op is ops[0] else np.log([3.0, 3.0]))
            else:
              with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                          error):
                sess.run(op)
      finally:
        patch.stop()

  def testFailedBuildLeavesNothing(self):
    with tempfile.TemporaryDirectory() as tmp:
      # A compiler that writes part of its output, says why it fails and
      # exits with status 3.
      compiler = os.path.join(tmp, "failing-c++")
      with open(compiler, "w") as f:
        f.write("#!/bin/sh\n"
                "for i in 1 2 3 4 5 6 7; do echo \"fake compiler line $i\"; "
                "done\n"
                "while [ $# -gt 0 ]; do\n"
                "  if [ \"$1\" = -o ]; then echo partial > \"$2\"; fi; shift\n"
                "done\n"
                "exit 3\n")
      os.chmod(compiler, stat.S_IRWXU)
      cache = os.path.join(tmp, "cache")
      with mock.patch.dict(os.environ, {"PTB_KERNEL_DIR": cache,
                                        "CXX": compiler}):
        with self.assertRaises(RuntimeError) as raised:
          kernels.build()
      message = str(raised.exception)
      self.assertIn("failing-c++ exited with status 3", message)
      self.assertIn("fake compiler line 7", message)    # its last lines
      self.assertNotIn("fake compiler line 1", message)
      self.assertEqual(os.listdir(cache), [])   # no partial library left

  def testSourceThatDoesNotCompileRaisesWithTheCompilersLastLines(self):
    skip_without_compiler(self)
    with tempfile.TemporaryDirectory() as tmp:
      source = os.path.join(tmp, "broken.cc")
      with open(source, "w") as f:
        f.write("#error deliberately broken source\n")
      cache = os.path.join(tmp, "cache")
      with mock.patch.dict(os.environ, {"PTB_KERNEL_DIR": cache}):
        with self.assertRaisesRegex(
            RuntimeError, "exited with status [1-9].*deliberately broken"):
          kernels.build(source)
      self.assertEqual(os.listdir(cache), [])   # no partial library left

  def testBuildsAndRegistersTheOpsOnAnyCpu(self):
    # Compiled without -mavx2 or -mavx512f: nothing here asks the CPU.
    skip_without_compiler(self)
    with mock.patch.object(kernel_offer, "cpu_flags", return_value=set()):
      path = kernels.build()
      library = kernels.load_library()
    self.assertEqual(os.path.dirname(path), _module["dir"])
    # One library, no partial ones (the plan's wisdom may lie beside).
    self.assertEqual([f for f in os.listdir(_module["dir"])
                      if f.endswith(".so")], [os.path.basename(path)])
    for op in _OPS:
      self.assertTrue(hasattr(library, op), msg=op)

  def testBuiltOnceThenLoadedFromTheCache(self):
    skip_without_compiler(self)
    # The cache on a source of its own, quick to compile.
    with tempfile.TemporaryDirectory() as tmp, \
        mock.patch.dict(os.environ, {"PTB_KERNEL_DIR": tmp}), \
        mock.patch.object(subprocess, "run", wraps=subprocess.run) as run:
      source = os.path.join(tmp, "tiny.cc")
      with open(source, "w") as f:
        f.write("int lstm_kernels_test_tiny() { return 1; }\n")
      path = kernels.build(source)
      self.assertEqual(run.call_count, 1)
      self.assertEqual(kernels.build(source), path)
      self.assertEqual(run.call_count, 1)
      self.assertEqual(sorted(os.listdir(tmp)),
                       sorted(["tiny.cc", os.path.basename(path)]))
    # The kernels, once built, are loaded without running the compiler.
    kernels.build()
    with mock.patch.object(subprocess, "run",
                           side_effect=AssertionError("compiler run")):
      library = kernels.load_library()
    for op in _OPS:
      self.assertTrue(hasattr(library, op), msg=op)


if __name__ == "__main__":
  tf.test.main()
