"""Tests of ptb/machine.py: the machine's limits, measured in-process."""

import contextlib
import io
import os
import tempfile
from unittest import mock

import tensorflow as tf

from ptb import kernel_offer
from ptb import kernels
from ptb import machine


def _kernels_buildable():
  """Whether this process can build and use the kernels here."""
  return kernel_offer.kernel_width()[0] is not None and kernels.compiler_found()


class MachineTest(tf.test.TestCase):

  def testLastLevelCacheFromSysfs(self):
    with tempfile.TemporaryDirectory() as tmp:
      for index, level, size in ((0, 1, "32K"), (2, 2, "512K"),
                                 (3, 3, "32768K")):
        os.makedirs(os.path.join(tmp, "index%d" % index))
        for name, value in (("level", str(level)), ("size", size)):
          with open(os.path.join(tmp, "index%d" % index, name), "w") as f:
            f.write(value + "\n")
      with open(os.path.join(tmp, "uevent"), "w") as f:
        f.write("")
      self.assertEqual(machine.llc_bytes(tmp), 32 << 20)
      self.assertIsNone(machine.llc_bytes(os.path.join(tmp, "none")))

  def testMemoryBandwidthOrNone(self):
    with mock.patch.object(kernel_offer, "kernel_width",
                           return_value=(None, "no width")):
      self.assertIsNone(machine.memory_bandwidth(None))
    if _kernels_buildable():
      # Any memory system of this century streams more than 0.5 GB/s.
      self.assertGreater(
          machine.memory_bandwidth(None, array_bytes=8 << 20, trials=1),
          0.5)

  def testFmaPeakInTheKernelsWidthOrNone(self):
    with mock.patch.object(kernel_offer, "kernel_width",
                           return_value=(None, "no width")):
      self.assertIsNone(machine.fma_peak(None))
    if _kernels_buildable():
      # One core at 1 GHz with one 8-lane FMA unit does 16 GFLOP/s.
      self.assertGreater(machine.fma_peak(None, seconds=0.01, trials=2), 16)

  def testBfloat16PeakOnlyWhereTheCpuHasAUnit(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "cpuinfo")
      with open(path, "w") as f:
        f.write("flags\t\t: avx2 fma\n")
      self.assertIsNone(machine.bf16_peak(None, cpuinfo=path))
    if not kernels.bf16_units() or not _kernels_buildable():
      self.skipTest("no CPU with AVX512_BF16/AMX here: its peak is owed")
    fma = machine.fma_peak(None, seconds=0.01, trials=2)
    # bfloat16 units multiply at least twice float32's lanes.
    self.assertGreater(machine.bf16_peak(None, seconds=0.01, trials=2),
                       1.5 * fma)

  def testBfloat16PeakUnknownWhereTheOpRefusesTheUnit(self):
    # cpuinfo lists the unit, the op finds it missing or not enabled (a
    # VM's flags, AMX tiles denied): the peak is unknown, with the reason.
    if not _kernels_buildable():
      self.skipTest("the kernels cannot be built here")
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "cpuinfo")
      with open(path, "w") as f:
        f.write("flags\t\t: avx2 fma avx512_bf16\n")
      # Where the unit is real, the op's refusal is simulated.
      refusal = tf.errors.PermissionDeniedError(
          None, None, "Bf16Peak: unit amx: the kernel refused")
      with (mock.patch.object(machine, "_peak", side_effect=refusal)
            if kernels.bf16_units() else contextlib.nullcontext()):
        with mock.patch("sys.stderr", new_callable=io.StringIO) as stderr:
          self.assertIsNone(machine.bf16_peak(None, seconds=0.01, trials=1,
                                              cpuinfo=path))
    self.assertRegex(stderr.getvalue(), r"^[^\n]+: warning: bfloat16 peak "
                     r"not measured: Bf16Peak: unit [^\n]+\n$")


if __name__ == "__main__":
  tf.test.main()
