"""Vector kernels for the LSTM's recurrent products and the softmax layer.

Every step of an LSTM layer multiplies a `[batch, K]` state by a `[K, N]`
weight matrix (h @ w_h forward, d_gates @ w_h^T backward) with batch = 20.
oneDNN's general GEMM re-packs the weights at every call and its register
tile is made for more rows. `kernels.cc` packs the weights once per
training step into panels of 32 columns (PackPanels) and streams them
through a register tile of a few rows x 32 columns, prefetching the next
panel while it works on the current one (PanelMatMul).

The softmax layer's logits `[N, 10000]` come from one large matmul, which
oneDNN does well; what follows it were passes over them, each reading and
writing all of them: the bias, the softmax, then p - onehot.
SoftmaxCrossEntropy does all of it a row at a time, in place, while the row
is in the L1 cache, with the loss.

ApplyOuterProduct updates a weight by a gradient of few rows, x^T @ g,
without forming it: one pass over the weight, the product summed in
registers (low_rank_update.py says when).

LstmCell (`lstm_cell`) is the LSTM cell's elementwise part in one op: from
the gates' pre-activations and the previous cell state, BlockLSTM's seven
outputs of a step, each row in one pass. lstm.py runs it as BLOCK's cell on
the CPU, after BASIC's products.

FmaPeak and StreamTriad measure the machine rather than computing the
model: independent FMA chains in registers on every thread, the float32
peak, and STREAM's triad over arrays far larger than the caches, the
memory bandwidth; benchmark.py reports the model's speed against both.
Bf16Peak measures the bfloat16 products' peak as FmaPeak does the float32
one, outside the two widths: its attribute unit is avx512_bf16
(VDPBF16PS chains), amx (TDPBF16PS on AMX tiles) or auto (amx, else
avx512_bf16), and a unit that the CPU lacks is an error. `bf16_units()`
says which units /proc/cpuinfo lists, without loading the library.
PackPanelsBf16 and PanelMatMulBf16 are PackPanels and PanelMatMul for
bfloat16 products: panels of bfloat16 pairs along K, multiplied with
VDPBF16PS (unit avx512_bf16) or the same arithmetic in scalar code
(unit scalar, on any CPU). TransposeBf16 transposes a weight gradient's
left operand and rounds it in one pass, for oneDNN's bfloat16 GEMM.

The kernels are written once over the vector width and compiled for two:
AVX-512 (tiles of 10 rows x 32 columns) and AVX2 with FMA (3 rows x 32
columns: 16 registers of 8 floats). Each vector op takes its width as its
attribute isa (`avx512` or `avx2`), which the model's builders pass from
the plan (ptb/plan.py says which width runs, and whether the kernels run at
all); `auto`, the default, runs the one PTB_KERNEL_ISA names, else the
widest the CPU has.

TensorFlow has no such kernels, so they are compiled here, once per machine
and TensorFlow version, with the C++ compiler ($CXX, else g++) against the
headers that the tensorflow wheel ships, and cached in $PTB_KERNEL_DIR
(default ~/.cache/ptb_word_lm). The source is compiled without -mavx2 or
-mavx512f, each width's functions carry their own target, so the library
compiles and its ops register on any x86-64 CPU; every op but PackPanels
(plain C++) runs vector code and refuses a width (Bf16Peak: a unit) that
the CPU cannot run.
`load_library()` builds and loads the library, or raises; `load()` keeps
it for the process, or returns None where it cannot be had.

Nothing here reads the run's flags, chooses a path or builds models.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
import time

from absl import logging
import tensorflow as tf

from ptb import data as data_lib

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "kernels.cc")
# Seconds a build may take (a build takes about 15 s on 2 cores).
_BUILD_TIMEOUT = 600
# Bf16Peak's units, in the order that its unit auto prefers them, each
# with the /proc/cpuinfo flags that it needs.
_BF16_UNIT_FLAGS = (("amx", ("amx_tile", "amx_bf16")),
                    ("avx512_bf16", ("avx512_bf16",)))

# The op library, once loaded (load()).
_state = {"library": None}
# Libraries loaded in this process, by file name (which names the source,
# compiler and TensorFlow). TensorFlow registers an op once per process: a
# second copy of the same library, from another directory, would come back
# without the ops that the first registered.
_libraries = {}


def bf16_units(cpuinfo="/proc/cpuinfo"):
  """Bf16Peak's units that the CPU lists, in auto's order of preference.

  "amx" where the flags line of `cpuinfo` has both amx_tile and amx_bf16,
  "avx512_bf16" where it has avx512_bf16; () if the file cannot be read.
  Python can decide with it without loading the library; the op checks
  CPUID and the OS's XCR0 itself.
  """
  flags = set()
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith("flags"):
          flags = set(line.split())
          break
  except OSError:
    return ()
  return tuple(unit for unit, needed in _BF16_UNIT_FLAGS
               if all(flag in flags for flag in needed))


def _compiler():
  return os.environ.get("CXX") or "g++"


def compiler_found():
  """True if the C++ compiler that `build()` runs is on the PATH."""
  return shutil.which(_compiler()) is not None


def _build_command(source, output):
  return ([_compiler(), "-std=c++17", "-shared", "-fPIC", "-O3",
           "-Wno-deprecated-declarations", source, "-o", output] +
          tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())


def library_path(source=_SOURCE):
  """The cached library for this source, compiler and TensorFlow."""
  with open(source, "rb") as f:
    digest = hashlib.sha256(f.read())
  digest.update(" ".join(_build_command("", "")).encode())
  digest.update(tf.__version__.encode())
  # Built kernels are kept in $PTB_KERNEL_DIR, else in the project's cache.
  directory = os.environ.get("PTB_KERNEL_DIR") or data_lib.cache_root()
  return os.path.join(directory,
                      "lstm_kernels-%s.so" % digest.hexdigest()[:16])


def _compile(source, output):
  """Runs the compiler; raises RuntimeError with its last lines if it fails."""
  try:
    result = subprocess.run(_build_command(source, output),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=_BUILD_TIMEOUT, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise RuntimeError("could not run %s: %s" % (_compiler(), e)) from e
  if result.returncode != 0:
    tail = result.stdout.decode(errors="replace").strip().splitlines()[-5:]
    raise RuntimeError("%s exited with status %d: %s" % (
        _compiler(), result.returncode, " | ".join(tail)))


def build(source=_SOURCE):
  """Compiles the kernels unless cached; returns the library's path.

  Raises:
    RuntimeError: the compiler is missing, failed or took too long; the
      message ends with the compiler's last lines of output.
  """
  path = library_path(source)
  if os.path.exists(path):
    return path
  os.makedirs(os.path.dirname(path), exist_ok=True)
  # Built under a temporary name and renamed into place, so that processes
  # starting together (the workers of a cluster) never load a partial file.
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
  os.close(fd)
  logging.info("Compiling the LSTM kernels (once per machine and TensorFlow "
               "version, about 15 s)")
  start = time.time()
  try:
    _compile(source, tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  logging.info("Built the LSTM kernels in %.1f s: %s", time.time() - start,
               path)
  return path


def load_library():
  """Builds the kernels unless cached and loads their op library, on any CPU.

  The ops register on any x86-64 CPU; whether they can run here is the
  plan's question (kernel_offer.offer).

  Returns:
    The op library (a module with `pack_panels`, `panel_mat_mul`,
    `softmax_cross_entropy`, `lstm_cell`, `apply_outer_product`,
    `fma_peak`, `bf16_peak` and `stream_triad`).

  Raises:
    RuntimeError: the build failed (see `build()`).
    OSError, tf.errors.OpError: the built file could not be loaded.
  """
  return _load_op_library(build())


def load():
  """The op library (load_library's), kept for the process; None if it fails.

  The graph builders take the ops from here where their part of the plan
  says that the kernels run (the plan loaded them first, kernel_offer.offer).
  """
  if _state["library"] is None:
    try:
      _state["library"] = load_library()
    except (RuntimeError, OSError, tf.errors.OpError):
      return None
  return _state["library"]


def _load_op_library(path):
  name = os.path.basename(path)
  if name not in _libraries:
    _libraries[name] = tf.load_op_library(path)
  return _libraries[name]
