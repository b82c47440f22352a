"""Tests of ptb/kernel_offer.py: the widths, the environment, the build."""

import os
import stat
import tempfile
from unittest import mock

import tensorflow as tf

from ptb import kernel_offer
from ptb import kernels

_NO_WIDTH = "the CPU has neither AVX-512 nor AVX2 with FMA"


def _cpuinfo(directory, flags):
  path = os.path.join(directory, "cpuinfo")
  with open(path, "w") as f:
    f.write("processor\t: 0\nflags\t\t: %s\n" % flags)
  return path


class OfferTest(tf.test.TestCase):
  """What the CPU, the environment and the kernels' build offer."""

  def testCpuFlagsAreRead(self):
    with tempfile.TemporaryDirectory() as tmp:
      for flags, isas in (
          ("fpu sse avx2 avx512f avx512bw", ("avx512",)),
          ("fpu sse avx2 avx512bw", ()),
          ("fpu sse fma avx2 avx512f avx512bw", ("avx512", "avx2")),
          ("fpu sse fma avx2", ("avx2",)),
          ("fpu sse avx fma", ())):
        self.assertEqual(kernel_offer.cpu_isas(_cpuinfo(tmp, flags)), isas,
                         msg=flags)
      self.assertEqual(kernel_offer.cpu_isas(os.path.join(tmp, "missing")), ())

  def testWidthFromTheCpuAndTheEnvironment(self):
    widest = "the widest this CPU has"
    with tempfile.TemporaryDirectory() as tmp:
      for flags, wanted, want in (
          ("avx512f avx2 fma", None, ("avx512", widest)),
          ("avx512f avx2 fma", "", ("avx512", widest)),
          ("avx512f avx2 fma", "avx2", ("avx2", "PTB_KERNEL_ISA=avx2")),
          ("avx512f avx2 fma", "avx512", ("avx512", "PTB_KERNEL_ISA=avx512")),
          ("avx2 fma", None, ("avx2", widest)),
          ("avx2 fma", "avx512",
           (None, "PTB_KERNEL_ISA=avx512 but the CPU has no AVX-512")),
          ("avx512f", "avx2",
           (None, "PTB_KERNEL_ISA=avx2 but the CPU has no AVX2 with FMA")),
          ("avx512f avx2 fma", "sse",
           (None, "PTB_KERNEL_ISA=sse is not one of avx512, avx2")),
          ("sse", None, (None, _NO_WIDTH))):
        environ = {} if wanted is None else {"PTB_KERNEL_ISA": wanted}
        self.assertEqual(
            kernel_offer.kernel_width(environ, _cpuinfo(tmp, flags)), want,
            msg=(flags, wanted))

  def testNothingBuiltWhereNothingCanRun(self):
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(
        kernels, "load_library", side_effect=AssertionError("built")):
      cpuinfo = _cpuinfo(tmp, "avx2 fma")
      self.assertEqual(kernel_offer.offer({"PTB_LSTM_KERNELS": "0"}, cpuinfo),
                       kernel_offer.Kernels(None,
                                        "disabled by PTB_LSTM_KERNELS=0"))
      self.assertEqual(kernel_offer.offer({}, _cpuinfo(tmp, "sse")),
                       kernel_offer.Kernels(None, _NO_WIDTH))

  def testAvx2OnlyCpuGetsTheKernels(self):
    if not kernels.compiler_found():
      self.skipTest("no C++ compiler to build the kernels with")
    with tempfile.TemporaryDirectory() as tmp:
      self.assertEqual(kernel_offer.offer({}, _cpuinfo(tmp, "avx2 fma")),
                       kernel_offer.Kernels("avx2", "the widest this CPU has"))

  def testFailedBuildGivesTensorFlowOps(self):
    with tempfile.TemporaryDirectory() as tmp:
      # A compiler that says why it fails and exits with status 3.
      compiler = os.path.join(tmp, "failing-c++")
      with open(compiler, "w") as f:
        f.write("#!/bin/sh\necho 'fake compiler line'\nexit 3\n")
      os.chmod(compiler, stat.S_IRWXU)
      cache = os.path.join(tmp, "cache")
      with mock.patch.dict(os.environ, {"PTB_KERNEL_DIR": cache,
                                        "CXX": compiler}):
        offered = kernel_offer.offer({}, _cpuinfo(tmp, "avx2 fma"))
      self.assertIsNone(offered.isa)
      self.assertIn("failing-c++ exited with status 3", offered.why)
      self.assertIn("fake compiler line", offered.why)
      self.assertEqual(os.listdir(cache), [])

  def testOfferedOnceAndLogged(self):
    kernel_offer.forget_offered()
    self.addCleanup(kernel_offer.forget_offered)
    none = kernel_offer.Kernels(None, "no reason")
    with mock.patch.object(kernel_offer, "offer", return_value=none) as offer, \
        self.assertLogs(level="WARNING") as logs:
      self.assertIs(kernel_offer.offered(), none)
      self.assertIs(kernel_offer.offered(), none)
    self.assertEqual(offer.call_count, 1)
    self.assertLen(logs.output, 1)
    self.assertIn("LSTM kernels not used (no reason)", logs.output[0])


if __name__ == "__main__":
  tf.test.main()
