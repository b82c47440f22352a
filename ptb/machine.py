"""The machine's limits, measured in this process: what benchmark.py reports.

The float32 FMA peak (the kernels' FmaPeak), the bfloat16 product peak
(Bf16Peak, where the CPU has AVX512_BF16 or AMX), TensorFlow's own float32
matmul rate, and the memory bandwidth (a STREAM triad, StreamTriad), each on
the session's thread pool; None where the kernels cannot be built. The
roofline (ptb/roofline.py) sets a run's speed against them.
"""

import os
import time

import tensorflow as tf

from ptb import bfloat16
from ptb import errors
from ptb import kernel_offer
from ptb import kernels


def llc_bytes(cache_dir="/sys/devices/system/cpu/cpu0/cache"):
  """The last-level cache's size in bytes, from sysfs (None if unknown)."""
  best = None
  try:
    for index in sorted(os.listdir(cache_dir)):
      if not index.startswith("index"):
        continue
      with open(os.path.join(cache_dir, index, "level")) as f:
        level = int(f.read())
      with open(os.path.join(cache_dir, index, "size")) as f:
        text = f.read().strip()
      unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
      size = int(text.rstrip("KMG")) * unit
      if best is None or level > best[0]:
        best = (level, size)
  except (OSError, ValueError):
    return None
  return best and best[1]


def _measuring_library():
  """The kernels' op library for measuring the machine, or None.

  None without a vector width or a compiler, or if the build fails: the
  measurements are then reported as unknown.
  """
  if kernel_offer.kernel_width()[0] is None or not kernels.compiler_found():
    return None
  try:
    return kernels.load_library()
  except (RuntimeError, OSError, tf.errors.OpError):
    return None


def memory_bandwidth(session_config, array_bytes=None, trials=5):
  """GB/s of a STREAM triad on the session's threads, or None without kernels.

  The kernels' StreamTriad op (a = b + 3 c) on every thread of the
  session's pool, each on its own contiguous part, with arrays of 8 times
  the last-level cache (at least 64 MiB each): the figure that an
  independent STREAM run reports. Bytes are STREAM's count, 12 an element.
  The fastest of a few rounds; the arrays are gone when it returns.
  """
  library = _measuring_library()
  if library is None:
    return None
  n = (array_bytes or max(64 << 20, 8 * (llc_bytes() or 0))) // 4
  with tf.Graph().as_default():
    elements = tf.compat.v1.placeholder(tf.int64, [])
    seconds = library.stream_triad(elements, tf.constant(trials, tf.int64))
    with tf.compat.v1.Session(config=session_config) as session:
      # The session's first call starts its pool's threads: a small one.
      session.run(seconds, {elements: 1 << 16})
      return 12 * n / session.run(seconds, {elements: n}) / 1e9


def matmul_ceiling(session_config, size=2048, seconds=0.7, trials=4):
  """GFLOP/s of float32 `size`^3 matrix multiplies in TensorFlow, here.

  The best of several short trials: on a shared machine a neighbour's burst
  lowers one trial, and the ceiling is what the machine can do.
  """
  with tf.Graph().as_default():
    a = tf.Variable(tf.random.uniform([size, size]))
    b = tf.Variable(tf.random.uniform([size, size]))
    # Distinct products, so that no graph optimisation merges them.
    products = [tf.matmul(a * (1.0 + i), b)[0, 0] for i in range(4)]
    with tf.compat.v1.Session(config=session_config) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(products)
      best = 0.0
      for _ in range(trials):
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
          session.run(products)
          runs += 1
        elapsed = time.perf_counter() - start
        best = max(best, runs * len(products) * 2 * size ** 3 / elapsed / 1e9)
  return best


def _peak(session_config, flops_and_checksum, seconds, trials):
  """Best GFLOP/s of an op that does `iterations` rounds of register work.

  Args:
    session_config: the session's config (its thread pool).
    flops_and_checksum: builds the op from an int64 iterations tensor;
      returns its (FLOPs done, checksum) tensors.
    seconds: how long one trial should take.
    trials: trials timed; the best counts.
  """
  with tf.Graph().as_default():
    iterations = tf.compat.v1.placeholder(tf.int64, [])
    flops, checksum = flops_and_checksum(iterations)
    with tf.compat.v1.Session(config=session_config) as session:

      def trial(n):
        """(FLOPs done, seconds taken) of n rounds."""
        start = time.perf_counter()
        done = session.run([flops, checksum], {iterations: n})[0]
        return done, time.perf_counter() - start

      trial(1000)  # the first call starts the pool's threads: not timed
      # Rounds enough to take `seconds`, judged by the faster of two calls:
      # one call slowed by the scheduler must not stop the search at a
      # count whose trials would time session.run's overhead instead.
      n, elapsed = 1000, min(trial(1000)[1], trial(1000)[1])
      while elapsed < seconds:
        n = int(n * min(100.0, 2 * seconds / max(elapsed, 1e-6)))
        elapsed = min(trial(n)[1], trial(n)[1])
      return max(done / took / 1e9
                 for done, took in (trial(n) for _ in range(trials)))


def fma_peak(session_config, seconds=0.05, trials=5):
  """GFLOP/s of this CPU's float32 FMA units, or None where it is unknown.

  The kernels' FmaPeak op runs independent FMA chains in registers on every
  thread of the session's pool, in the width the kernels run here (so with
  PTB_KERNEL_ISA=avx2, the AVX2 peak): no memory, no dependency stalls, the
  figure no code on this machine can exceed. Best of a few short trials.
  None without a compiler or a width (see ptb/kernels.py).
  """
  library = _measuring_library()
  if library is None:
    return None
  return _peak(session_config, library.fma_peak, seconds, trials)


def bf16_peak(session_config, seconds=0.05, trials=5, cpuinfo=None):
  """GFLOP/s of this CPU's bfloat16 products, or None where it has none.

  The kernels' Bf16Peak op: AMX tile products where the CPU has them, else
  VDPBF16PS chains (AVX512_BF16), on every thread of the session's pool,
  as fma_peak measures float32. None on a CPU without either unit (its
  bfloat16 products run on the float32 FMA units), without the kernels, or
  where the op refuses the unit (not enabled by the OS, AMX tiles denied to
  this process): a warning line gives the op's reason.
  """
  if not kernels.bf16_units(cpuinfo or bfloat16.CPUINFO):
    return None
  library = _measuring_library()
  if library is None:
    return None
  try:
    return _peak(session_config, library.bf16_peak, seconds, trials)
  except tf.errors.OpError as e:
    errors.warn("bfloat16 peak not measured: %s" % errors.op_message(e))
    return None
