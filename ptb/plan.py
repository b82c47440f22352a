"""The plan: every choice a session call makes, made once per run.

Which path each LSTM layer takes, how its recurrent products run, which
softmax loss, how each weight is updated, which products a @ w^T are
swapped and which vector width the kernels run: `make` computes all of it
once, from the config, the devices, the dtype and what the CPU and the
kernels offer (`offered`). ptb_word_lm.main and benchmark.py compute the
plan, print it (`line`, `fields`) and pass it down; lstm.py, softmax.py and
util.py take their part as a plain argument and decide nothing themselves.

The thresholds live here (`THRESHOLDS`), each with its reason. What the
kernels offer (`offered`, `Kernels`) comes from ptb/kernel_offer.py and is
named here too, as the plan's first input.
"""

import collections
import dataclasses
from typing import Optional, Tuple

import tensorflow as tf

from ptb.bfloat16 import BFLOAT16, FLOAT32
from ptb.config import BASIC, BLOCK, CUDNN
# pylint: disable=unused-import
from ptb.kernel_offer import Kernels
from ptb.kernel_offer import offered
# pylint: enable=unused-import

# A layer's path (Lstm.paths).
WAVEFRONT = "wavefront"    # every layer in one custom gradient, by time chunks
LAYER = "layer"            # one custom gradient per layer, one after the other
BLOCK_LSTM = "BlockLSTM"   # tf.raw_ops.BlockLSTM's forward, the shared backward
CUDNN_RNN = "cuDNN"        # CudnnRNNV3 and its registered gradient
# The cell of WAVEFRONT and LAYER (Lstm.cell).
OPS_CELL = "ops"           # core ops (BASIC)
FUSED_CELL = "LstmCell"    # the kernels' fused cell (BLOCK on the CPU)
# Products: the recurrent one h @ w_h, and d @ w^T in the backward pass.
KERNELS = "kernels"        # PackPanels once per pass, then PanelMatMul
MATMUL = "matmul"          # tf.matmul
TRANSPOSED = "transposed"  # w_h transposed once per pass, then tf.matmul
PLAIN = "plain"            # tf.matmul(d, w, transpose_b=True)
SWAPPED = "swapped"        # tf.transpose(tf.matmul(w, d, transpose_b=True))
# The softmax loss (Softmax.loss).
KERNEL = "kernel"          # the kernels' SoftmaxCrossEntropy
OPS = "ops"                # TensorFlow's softmax
# A weight's update (Step.updates).
DENSE = "dense"            # the gradient formed, then applied
FACTORS = "factors"        # from its factors x^T @ g (low_rank_update.py)


class Thresholds(collections.namedtuple("Thresholds", (
    "wavefront_chunk", "wavefront_below_hidden", "kernel_min_hidden",
    "kernel_min_batch", "kernel_min_steps", "factor_max_rows",
    "swap_max_rows", "swap_min_weight"))):
  """The sizes at which a choice changes; THRESHOLDS holds them, with why."""


THRESHOLDS = Thresholds(
    # Chunks of 4 steps let two layers' recurrences overlap on two cores
    # (small's steps 10 % shorter).
    wavefront_chunk=4,
    # From hidden 1024 each layer's step products are bound by memory
    # bandwidth: side by side they gain nothing (large lost 6 %).
    wavefront_below_hidden=1024,
    # Below, the recurrent products fit in the L2 cache and oneDNN is as
    # fast: packing is pure cost (small trained 2-5 % slower with it).
    kernel_min_hidden=512,
    # With batch 1 (the test pass) packing would be repeated at every call
    # for products of one row.
    kernel_min_batch=8,
    # Packing, or transposing w_h, reads and writes the weights once per
    # pass: it pays only over enough steps.
    kernel_min_steps=8,
    # Beyond, the dense matmul's blocking beats ApplyOuterProduct's register
    # tiles, and the traffic saved matters less (no default config has so
    # few rows).
    factor_max_rows=128,
    # Swapped, a product of few rows reads the large weight in its own
    # layout; with many rows the plain one is faster (at 400 rows on the
    # Zen 4, docs/performance.md) ...
    swap_max_rows=128,
    # ... and only a weight beyond a core's L2 (4 MiB in float32) gains;
    # GPUs' libraries need no such help.
    swap_min_weight=1 << 20)

@dataclasses.dataclass(frozen=True)
class Lstm:
  """How the LSTM layers of one session call run: lstm.py's part.

  Attributes:
    paths: each layer's path: WAVEFRONT, LAYER, BLOCK_LSTM or CUDNN_RNN.
    chunk: steps per time chunk of the WAVEFRONT, else None.
    cell: OPS_CELL or FUSED_CELL; BLOCK_LSTM or CUDNN_RNN on those paths.
    forward: the recurrent product h @ w_h: KERNELS or MATMUL (the op
      itself on BLOCK_LSTM and CUDNN_RNN).
    backward: d_gates @ w_h^T: KERNELS, TRANSPOSED, PLAIN or SWAPPED; None
      without a backward pass of ours (evaluation, CUDNN_RNN).
    input_gradients: d_gates @ w_x^T, PLAIN or SWAPPED, for each time block
      of the backward pass (the WAVEFRONT's chunks, else one block).
    isa: the width of the kernels' ops built, None where none are.
    products: the products' dtype, bfloat16.FLOAT32 or BFLOAT16.
  """
  paths: Tuple[str, ...]
  chunk: Optional[int]
  cell: str
  forward: str
  backward: Optional[str]
  input_gradients: Tuple[str, ...]
  isa: Optional[str]
  products: str = FLOAT32


@dataclasses.dataclass(frozen=True)
class Softmax:
  """How the softmax layer runs: softmax.py's part.

  Attributes:
    loss: KERNEL or OPS.
    input_gradient: d_logits @ softmax_w^T, PLAIN or SWAPPED; None in
      evaluation.
    isa: the width of the kernel's op, None with OPS.
    products: the dtype of the logits' product and its gradients' products.
  """
  loss: str
  input_gradient: Optional[str]
  isa: Optional[str]
  products: str = FLOAT32


@dataclasses.dataclass(frozen=True)
class Step:
  """Every choice of one model's session call.

  Attributes:
    batch, steps: rows per tower and time steps per call.
    lstm, softmax: the parts of lstm.lstm_stack and softmax.softmax_loss.
    updates: training only: FACTORS where the LSTM kernels and the softmax
      weight and bias are updated from their factors (the embedding's
      gradient stays sparse and the LSTM biases' dense), else DENSE; None
      in evaluation.
    isa: the width of ApplyOuterProduct with FACTORS, else None.
    norm_threads: training only: above 0, the clipping norm is summed as
      TensorFlow 1.5.1 summed it on that many cores (ptb/original_norm.py,
      --original_norm_threads); 0: exactly.
  """
  batch: int
  steps: int
  lstm: Lstm
  softmax: Softmax
  updates: Optional[str]
  isa: Optional[str]
  norm_threads: int = 0


@dataclasses.dataclass(frozen=True)
class Plan:
  """A run's plan: what the kernels offer, and each model's Step.

  Attributes:
    kernels: Kernels.
    train: the training step.
    valid, test: the evaluation calls, or None (benchmark.py trains only).
    how, why: "estimate" (the rules) or "measure" (ptb/planner.py), and
      why, for the Plan: line.
  """
  kernels: Kernels
  train: Step
  valid: Optional[Step] = None
  test: Optional[Step] = None
  how: str = "estimate"
  why: str = "the rules of ptb/plan.py"


@dataclasses.dataclass(frozen=True)
class Choices:
  """What a measured plan (ptb/planner.py) sets over the rules (None: keep).

  Attributes:
    recurrent: the training step's (forward, backward) recurrent products:
      (KERNELS, KERNELS), or MATMUL and TRANSPOSED, PLAIN or SWAPPED.
    input_gradients: PLAIN or SWAPPED for every time block of the
      training step.
    softmax_input_gradient: PLAIN or SWAPPED in the training step.
    lstm_products, softmax_products: each part's products' dtype in every
      step (FLOAT32 where BFLOAT16 was asked but measured slower).
  """
  recurrent: Optional[Tuple[str, str]] = None
  input_gradients: Optional[str] = None
  softmax_input_gradient: Optional[str] = None
  lstm_products: Optional[str] = None
  softmax_products: Optional[str] = None


RULES = Choices()


def _swap(rows, weight, cpu, limits):
  """PLAIN or SWAPPED for a product of `rows` rows with a w of `weight`."""
  return (SWAPPED if cpu and rows <= limits.swap_max_rows and
          weight >= limits.swap_min_weight else PLAIN)


def _time_blocks(steps, chunk):
  """The sizes of a call's time blocks: chunks of `chunk` steps, or one."""
  chunk = chunk or steps
  return [min(chunk, steps - s) for s in range(0, steps, chunk)]


def _cell(rnn_mode, isa, products=FLOAT32):
  """The cell of BASIC or BLOCK: OPS_CELL, FUSED_CELL, or BLOCK_LSTM.

  BLOCK's fused cell on the CPU is the kernels' LstmCell after BASIC's
  products: BlockLSTM's CPU kernel does one Eigen product of [x_t, h] per
  step, and trained slower than BASIC in every config. BlockLSTM makes its
  products itself, in its one dtype: with bfloat16 products and no kernels,
  BLOCK takes BASIC's cell (the same function).
  """
  if rnn_mode == BASIC:
    return OPS_CELL
  if isa:
    return FUSED_CELL
  return OPS_CELL if products == BFLOAT16 else BLOCK_LSTM


def _packed(hidden, batch, steps, isa, limits, products=FLOAT32, bf16=False):
  """Whether the recurrent products run on the kernels' panels.

  float32 products on PackPanels' panels; bfloat16 products on
  PackPanelsBf16's where the CPU has VDPBF16PS (`bf16`), else on
  tf.matmul (oneDNN).
  """
  return (isa is not None and (products == FLOAT32 or bf16) and
          hidden >= limits.kernel_min_hidden and
          batch >= limits.kernel_min_batch and
          steps >= limits.kernel_min_steps)


def _backward(packed, hidden, batch, steps, cpu, limits):
  """The backward pass's recurrent product d_gates @ w_h^T."""
  if packed:
    return KERNELS
  if steps >= limits.kernel_min_steps:
    return TRANSPOSED
  return _swap(batch, hidden * 4 * hidden, cpu, limits)


def lstm(rnn_mode, num_layers, hidden, batch, steps, isa=None, cpu=True,
         training=True, limits=THRESHOLDS, products=FLOAT32, bf16=False,
         recurrent=None, input_gradient=None):
  """The LSTM's part of a Step (Lstm).

  Args:
    rnn_mode: BASIC, BLOCK or CUDNN.
    num_layers, hidden: the layers and their size (inputs of the same size).
    batch, steps: rows per tower and time steps of the call.
    isa: the kernels' width where this call's tensors can use them
      (float32 on a CPU), else None.
    cpu: whether the towers are CPUs.
    training: whether the call has a backward pass.
    limits: Thresholds.
    products: the products' dtype (bfloat16.FLOAT32 or BFLOAT16).
    bf16: whether the CPU has VDPBF16PS (Kernels.bf16).
    recurrent, input_gradient: Choices.recurrent and .input_gradients over
      the rules (training only).
  """
  if rnn_mode == CUDNN:
    return Lstm((CUDNN_RNN,) * num_layers, None, CUDNN_RNN, CUDNN_RNN, None,
                (), None, products)
  cell = _cell(rnn_mode, isa, products)
  packed = _packed(hidden, batch, steps, isa, limits, products, bf16)
  if cell == BLOCK_LSTM:
    chunk, path, forward = None, BLOCK_LSTM, BLOCK_LSTM
  else:
    chunk = (limits.wavefront_chunk
             if hidden < limits.wavefront_below_hidden else None)
    path, forward = WAVEFRONT if chunk else LAYER, KERNELS if packed else MATMUL
  backward, input_gradients = None, ()
  if training:
    backward = _backward(packed, hidden, batch, steps, cpu, limits)
    if recurrent and path != BLOCK_LSTM:
      forward, backward = recurrent
      if forward == KERNELS and not (isa and (products == FLOAT32 or bf16)):
        raise ValueError("no kernels' panels for %s products here" % products)
      packed = forward == KERNELS
    input_gradients = tuple(
        input_gradient or _swap(size * batch, hidden * 4 * hidden, cpu, limits)
        for size in _time_blocks(steps, chunk))
  uses_kernels = packed or cell == FUSED_CELL
  return Lstm((path,) * num_layers, chunk, cell, forward, backward,
              input_gradients, isa if uses_kernels else None, products)


def step(config, batch, steps, devices, dtype, kernels, training=True,
         workers=1, limits=THRESHOLDS, products=FLOAT32, choices=RULES):
  """One model's Step: its LSTM, softmax loss and updates.

  Args:
    config: the config (rnn_mode resolved: BASIC, BLOCK or CUDNN).
    batch, steps: rows per tower and time steps per call.
    devices: the model's tower devices.
    dtype: the variables' and activations' dtype.
    kernels: Kernels (offered()).
    training: whether the model trains.
    workers: the processes that train together (a cluster's workers).
    limits: Thresholds.
    products: the products' dtype (bfloat16.FLOAT32 or BFLOAT16; the
      variables stay `dtype`).
    choices: Choices over the rules (a measured plan's).
  """
  cpu = not any("GPU" in d.upper() for d in devices)
  isa = kernels.isa if cpu and dtype == tf.float32 else None
  rows = batch * steps
  softmax = Softmax(
      KERNEL if isa else OPS,
      (choices.softmax_input_gradient or
       _swap(rows, config.hidden_size * config.vocab_size, cpu, limits))
      if training else None, isa, choices.softmax_products or products)
  # The towers' gradients are averaged densely, and a cluster's
  # accumulators take dense tensors: the factors serve one tower alone.
  factored = (training and isa is not None and len(devices) == 1 and
              workers == 1 and rows <= limits.factor_max_rows)
  return Step(batch, steps,
              lstm(config.rnn_mode, config.num_layers, config.hidden_size,
                   batch, steps, isa, cpu, training, limits,
                   choices.lstm_products or products, kernels.bf16,
                   choices.recurrent, choices.input_gradients),
              softmax,
              (FACTORS if factored else DENSE) if training else None,
              isa if factored else None)


def eval_windows(eval_unroll, num_steps):
  """Windows per session call of validation and test: eval_unroll steps."""
  return max(1, eval_unroll // num_steps)


def make(config, devices, dtype, kernels, workers=1, eval_config=None,
         eval_unroll=1, limits=THRESHOLDS, products=FLOAT32, choices=RULES,
         how=("estimate", "the rules of ptb/plan.py")):
  """The run's Plan.

  Args:
    config: the training config (rnn_mode resolved).
    devices: the training towers' devices; evaluation runs on the first.
    dtype: tf.float32, or tf.float16 (--use_fp16).
    kernels: Kernels (offered()).
    workers: the processes that train together.
    eval_config: the test pass's config (batch 1, 1 step), or None for a
      plan of the training step alone.
    eval_unroll: time steps per session call of validation and test; the
      plan is of a full call (a corpus too short for one runs the same
      choices on fewer steps).
    limits: Thresholds.
    products: the products' dtype: bfloat16.BFLOAT16 with --use_bf16.
    choices: Choices over the rules; the products' dtypes apply to every
      step, the rest to the training step.
    how: (Plan.how, Plan.why).
  """
  train = step(config, config.batch_size, config.num_steps, devices, dtype,
               kernels, True, workers, limits, products, choices)
  if eval_config is None:
    return Plan(kernels, train, how=how[0], why=how[1])
  dtypes = Choices(lstm_products=choices.lstm_products,
                   softmax_products=choices.softmax_products)
  evaluations = [
      step(c, c.batch_size,
           c.num_steps * eval_windows(eval_unroll, c.num_steps),
           devices[:1], dtype, kernels, False, 1, limits, products, dtypes)
      for c in (config, eval_config)]
  return Plan(kernels, train, *evaluations, how=how[0], why=how[1])


def with_original_norm(plan, threads):
  """The plan, its training step's clipping norm summed as TensorFlow 1.5.1
  summed it on `threads` cores (0: the plan as it is)."""
  if not threads:
    return plan
  return dataclasses.replace(
      plan, train=dataclasses.replace(plan.train, norm_threads=threads))


def _swapped(step_plan):
  """The products a @ w^T that the step swaps, as fields() names them."""
  lstm_plan, names = step_plan.lstm, []
  if step_plan.softmax.input_gradient == SWAPPED:
    names.append("softmax")
  blocks = lstm_plan.input_gradients
  done = blocks.count(SWAPPED)
  if done:
    names.append("inputs" if done == len(blocks)
                 else "inputs:%d/%d" % (done, len(blocks)))
  if lstm_plan.backward == SWAPPED:
    names.append("recurrent")
  return ",".join(names) or "none"


def fields(plan):
  """The plan as key=value fields of one line ({key: text}, in order).

  kernels (the width or none), lstm (each layer's path), chunk, cell,
  recurrent and backward (the training step's recurrent products),
  recurrent_valid and recurrent_test (where the plan has them), softmax,
  updates, swapped (the training step's swapped products, or none),
  products (their dtype, each part's where they differ), norm (only where
  the clipping norm is TensorFlow 1.5.1's: "tf1.5xN", N its cores) and
  plan (how it was made: estimate or measure).
  """
  train = plan.train
  out = collections.OrderedDict([
      ("kernels", plan.kernels.isa or "none"),
      ("lstm", ",".join(train.lstm.paths)),
      ("chunk", str(train.lstm.chunk or "none")),
      ("cell", train.lstm.cell),
      ("recurrent", train.lstm.forward),
      ("backward", train.lstm.backward or "none")])
  for name in ("valid", "test"):
    if getattr(plan, name) is not None:
      out["recurrent_" + name] = getattr(plan, name).lstm.forward
  out["softmax"] = train.softmax.loss
  out["updates"] = train.updates
  out["swapped"] = _swapped(train)
  lstm_dtype, softmax_dtype = train.lstm.products, train.softmax.products
  out["products"] = (lstm_dtype if lstm_dtype == softmax_dtype else
                     "lstm:%s,softmax:%s" % (lstm_dtype, softmax_dtype))
  if train.norm_threads:
    out["norm"] = "tf1.5x%d" % train.norm_threads
  out["plan"] = plan.how
  return out


def line(plan):
  """The plan in one line for people: "Plan: kernels=avx2 (why) lstm=..."."""
  items = ["%s=%s" % kv for kv in fields(plan).items()]
  items[0] += " (%s)" % plan.kernels.why
  items[-1] += " (%s)" % plan.why
  return "Plan: " + " ".join(items)


def record(plan):
  """The plan as the summary JSON records it: fields() and both whys."""
  out = dict(fields(plan))
  out["kernels_why"] = plan.kernels.why
  out["plan_why"] = plan.why
  return out
