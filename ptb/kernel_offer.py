"""What the CPU and the kernels offer this process: a vector width, or why none.

The environment variables that choose the kernels are read here and nowhere
else in ptb/: PTB_LSTM_KERNELS=0 turns them off, PTB_KERNEL_ISA (avx512 or
avx2) names their width. The plan (ptb/plan.py) takes `offered()` as the
first of its inputs.
"""

import dataclasses
import os
from typing import Optional

from absl import logging
import tensorflow as tf

from ptb import kernels as kernels_lib

# The kernels' vector widths, widest first, and the CPU flags each needs
# (as /proc/cpuinfo spells them).
ISAS = ("avx512", "avx2")
_ISA_FLAGS = {"avx512": ("avx512f",), "avx2": ("avx2", "fma")}
ISA_NAMES = {"avx512": "AVX-512", "avx2": "AVX2 with FMA"}
CPUINFO = "/proc/cpuinfo"


@dataclasses.dataclass(frozen=True)
class Kernels:
  """What the CPU and the kernels offer this process.

  Attributes:
    isa: the kernels' vector width ("avx512" or "avx2"), None without them.
    why: how the width was chosen, or why there are no kernels.
    bf16: whether the CPU has VDPBF16PS (AVX512_BF16), which runs
      bfloat16 products on the kernels' panels (PanelMatMulBf16).
  """
  isa: Optional[str]
  why: str
  bf16: bool = False


def cpu_flags(cpuinfo):
  """The CPU's flags that `cpuinfo` lists (none if it cannot be read)."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split())
  except OSError:
    pass
  return set()


def cpu_isas(cpuinfo=CPUINFO):
  """The kernels' widths that this CPU runs, widest first (names of ISAS).

  "avx512" with the avx512f flag, "avx2" with both avx2 and fma; none if
  `cpuinfo` cannot be read.
  """
  flags = cpu_flags(cpuinfo)
  return tuple(isa for isa in ISAS
               if all(flag in flags for flag in _ISA_FLAGS[isa]))


def kernel_width(environ=None, cpuinfo=CPUINFO):
  """The kernels' width here, and how it was chosen or why there is none.

  PTB_KERNEL_ISA (`avx512` or `avx2`) chooses it; unset or empty, the
  widest that the CPU has. The ops (kernels.cc) refuse a width that the CPU
  cannot run.

  Args:
    environ: the environment (os.environ by default).
    cpuinfo: the file that lists the CPU's flags.

  Returns:
    (isa, why): isa one of ISAS, or None when no width can run.
  """
  environ = os.environ if environ is None else environ
  available = cpu_isas(cpuinfo)
  wanted = environ.get("PTB_KERNEL_ISA", "")
  if not wanted:
    if available:
      return available[0], "the widest this CPU has"
    return None, "the CPU has neither AVX-512 nor AVX2 with FMA"
  if wanted not in ISAS:
    return None, "PTB_KERNEL_ISA=%s is not one of %s" % (
        wanted, ", ".join(ISAS))
  if wanted not in available:
    return None, "PTB_KERNEL_ISA=%s but the CPU has no %s" % (
        wanted, ISA_NAMES[wanted])
  return wanted, "PTB_KERNEL_ISA=%s" % wanted


def offer(environ=None, cpuinfo=CPUINFO):
  """What the kernels offer here: a width, or why none (Kernels).

  None with PTB_LSTM_KERNELS=0, without a width (kernel_width) or where
  the build or the loading fails; nothing is built then for nothing.
  """
  environ = os.environ if environ is None else environ
  if environ.get("PTB_LSTM_KERNELS", "1") == "0":
    return Kernels(None, "disabled by PTB_LSTM_KERNELS=0")
  isa, why = kernel_width(environ, cpuinfo)
  if isa is None:
    return Kernels(None, why)
  try:
    kernels_lib.load_library()
  except (RuntimeError, OSError, tf.errors.OpError) as e:
    return Kernels(None, str(e))
  return Kernels(isa, why, "avx512_bf16" in kernels_lib.bf16_units(cpuinfo))


_offered = []


def offered():
  """offer() of this process's environment and CPU, once per process.

  The outcome is logged once: the width, or as a warning why none.
  """
  if not _offered:
    _offered.append(offer())
    kernels = _offered[0]
    if kernels.isa is None:
      logging.warning("LSTM kernels not used (%s); the recurrent products "
                      "use tf.matmul and the softmax layer TensorFlow's "
                      "softmax.", kernels.why)
    else:
      logging.info("LSTM kernels use %s (%s).", ISA_NAMES[kernels.isa],
                   kernels.why)
  return _offered[0]


def forget_offered():
  """Makes offered() look again (tests)."""
  del _offered[:]
