"""TensorFlow's oneDNN ops on every x86 CPU, not only the newest.

TensorFlow's Linux wheels carry oneDNN, but turn its ops on by default only
on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (Intel from Cascade
Lake, AMD from Zen 4). Elsewhere, on AVX2 CPUs such as AMD's Zen 3 and
Intel's client CPUs, every matmul runs on Eigen's GEMM: on a Zen 3 it
reached 68 to 88 GFLOP/s on 2048^3, where oneDNN reached 127 to 135
(docs/performance.md). So the entry points turn oneDNN on, before
TensorFlow is imported; TF_ENABLE_ONEDNN_OPTS=0 in the environment still
turns it off.
"""

import os

_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


def enable():
  """Turns TensorFlow's oneDNN ops on unless the environment says otherwise.

  Call before TensorFlow is imported: it reads the setting once.

  Returns:
    True if this call set it.
  """
  if _VARIABLE in os.environ:
    return False
  os.environ[_VARIABLE] = "1"
  return True


def enabled():
  """Whether this process's TensorFlow runs its oneDNN ops (imports it)."""
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import _pywrap_util_port
  return bool(_pywrap_util_port.IsMklEnabled())


def matmul_library():
  """Names what runs this process's matmuls, for reports: onednn or eigen."""
  return "onednn" if enabled() else "eigen"
