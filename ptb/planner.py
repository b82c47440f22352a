"""A plan that measures: the fastest path of each product, timed here.

The rules of ptb/plan.py were tuned on a few CPUs; which path of a product
is fastest differs between CPUs (and between oneDNN versions). As FFTW's
planner in its MEASURE mode, `make` times each candidate path of the
training step's products at the step's own shapes, in graphs of their own
whose calls take turns, on the first run of a config on a machine, and
keeps the choices as wisdom: a JSON file beside the built kernels, named
by a digest of the CPU model and instruction sets, the TensorFlow version,
the kernels' and this module's source, the config's shapes and dtypes and
the rules' plan. Later runs read it and time nothing. The candidates:

  recurrent        h @ w_h and d_gates @ w_h^T over the step's time steps:
                   the kernels' panels (where this dtype has them), or
                   tf.matmul with the backward TRANSPOSED, PLAIN or SWAPPED
  input gradients  d_gates @ w_x^T of a time block, PLAIN or SWAPPED
  softmax          d_logits @ softmax_w^T, PLAIN or SWAPPED
  products         with --use_bf16: each part's products (the LSTM's, the
                   softmax layer's) in bfloat16 or in float32, all of that
                   part's products timed in each; bfloat16 must beat
                   float32 by MARGIN, since it rounds

A candidate replaces the rules' choice only when it is faster by more than
MARGIN (noise then keeps the rules). On the WAVEFRONT path (layers side by
side, a core each) the LSTM's paths stay the rules': timed alone on all
the cores, they would mislead; only their dtype is chosen there. Steps below MIN_FLOPS (tests' tiny
configs) and GPU towers keep the rules: their timings would choose nothing
that matters. Every path the planner can pick is one the equivalence tests
cover.
"""

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
import time

import tensorflow as tf

from ptb import bfloat16
from ptb import kernel_offer
from ptb import kernels as kernels_lib
from ptb import plan as plan_lib
from ptb import recurrent_product
from ptb import roofline as roofline_lib
from ptb import transposed_product

MODES = ("measure", "estimate")
# A candidate must beat the rules' choice by this much to replace it.
MARGIN = 0.05
# Training steps of fewer product FLOPs keep the rules.
MIN_FLOPS = 1e9
REPEATS = 5
# Wisdom is of this planner's code: another version times afresh.
with open(__file__, "rb") as _f:
  _SOURCE_DIGEST = hashlib.sha256(_f.read()).hexdigest()[:16]
_CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpu_model(cpuinfo=kernel_offer.CPUINFO):
  """The CPU's model name and the flags that choose paths, for the key."""
  flags = kernel_offer.cpu_flags(cpuinfo)
  return (roofline_lib.cpu_model(cpuinfo),
          sorted(f for f in _CPU_FLAGS if f in flags))


def wisdom_key(config, estimate, dtype, devices, workers):
  """The digest that names a plan's wisdom (see the module's docstring)."""
  return hashlib.sha256(json.dumps({
      "cpu": _cpu_model(), "threads": os.cpu_count(),
      "tensorflow": tf.__version__,
      "kernels": os.path.basename(kernels_lib.library_path()),
      "planner": _SOURCE_DIGEST,
      "config": [config.rnn_mode, config.num_layers, config.hidden_size,
                 config.vocab_size, config.batch_size, config.num_steps],
      "dtype": dtype.name, "towers": len(devices), "workers": workers,
      "rules": plan_lib.fields(estimate),
      "products": [estimate.train.lstm.products,
                   estimate.train.softmax.products],
  }, sort_keys=True).encode()).hexdigest()[:16]


def step_flops(config):
  """The products' FLOPs of one training step of one tower."""
  return (roofline_lib.train_flops_per_word(config) * config.batch_size *
          config.num_steps)


def _median_seconds(build, repeats):
  """The median time of a session call of build()'s fetches (see
  _median_times)."""
  return _median_times({None: build}, repeats)[None]


def _median_times(builds, repeats):
  """{name: the median time of a session call of builds[name]()'s fetches}.

  Each candidate runs in a graph and session of its own, after one call
  that packs, caches primitives and warms up. The candidates then take
  turns, one call each a round, the first of a round rotating, so that a
  passing slowdown of the machine (another process waking, a clock change)
  falls on all of them alike: with each candidate's calls in one stretch,
  it could make one look slower, and the choice is kept for good.
  """
  names = list(builds)
  if not names:
    return {}
  times = {name: [] for name in names}
  with contextlib.ExitStack() as stack:
    calls = {}
    for name in names:
      graph = tf.Graph()
      with graph.as_default():
        fetches = builds[name]()
        init = tf.compat.v1.global_variables_initializer()
      session = stack.enter_context(tf.compat.v1.Session(graph=graph))
      session.run(init)
      session.run(fetches)
      calls[name] = functools.partial(session.run, fetches)
    for turn in range(repeats):
      first = turn % len(names)
      for name in names[first:] + names[:first]:
        start = time.perf_counter()
        calls[name]()
        times[name].append(time.perf_counter() - start)
  return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def _weight(shape):
  """A float32 variable of `shape`, uniform in [-0.1, 0.1)."""
  return tf.Variable(tf.random.uniform(shape, -0.1, 0.1))


def _sum(tensors):
  """One small fetch that needs all of `tensors`."""
  return tf.add_n([tf.reduce_sum(t) for t in tensors])


def recurrent_chain(lstm_plan, batch, hidden, steps):
  """A builder: `steps` forward recurrent products, each on the last one's
  output, then `steps` backward ones, as the plan.Lstm runs them (packing
  and casts included)."""
  def build():
    w_h = _weight([hidden, 4 * hidden])
    operand = bfloat16.operand(w_h, recurrent_product.dtype(lstm_plan))
    forward = recurrent_product.forward(lstm_plan, operand)
    h, x = _weight([batch, hidden]), _weight([batch, 4 * hidden])
    for _ in range(steps):
      h = forward(h, x)[:, :hidden]
    backward = recurrent_product.backward(lstm_plan, operand, batch)
    d = _weight([batch, 4 * hidden])
    for _ in range(steps):
      d = tf.tile(backward(d), [1, 4])
    return _sum([h, d])
  return build


def transposed(rows, inner, cols, swapped, products):
  """A builder: [rows, inner] @ w^T with w [cols, inner] (PLAIN/SWAPPED)."""
  def build():
    a = bfloat16.operand(_weight([rows, inner]), products)
    w = bfloat16.operand(_weight([cols, inner]), products)
    return _sum([transposed_product.matmul_transposed(a, w, swapped,
                                                      products)])
  return build


def product(rows, inner, cols, products, transpose_a=False, isa=None):
  """A builder: [rows, inner] @ [inner, cols] (a given as [inner, rows]
  with transpose_a), as bfloat16.matmul runs it."""
  def build():
    a = _weight([inner, rows] if transpose_a else [rows, inner])
    return _sum([bfloat16.matmul(a, _weight([inner, cols]), products,
                                 transpose_a=transpose_a, isa=isa)])
  return build


def _pick(seconds, rules):
  """The fastest candidate of {candidate: seconds}, unless the rules'
  choice is within MARGIN of it."""
  best = min(seconds, key=seconds.get)
  if rules in seconds and seconds[rules] <= seconds[best] * (1 + MARGIN):
    return rules
  return best


def _products_dtype(seconds):
  """A part's products' dtype from {dtype: seconds of its products}.

  bfloat16 only where it is faster than float32 by more than MARGIN: it
  rounds the operands, and a lead within the timings' noise buys nothing
  (the whole step, casts and cell included, can then run slower than in
  float32, as the how-to's class did when ties went to bfloat16).
  """
  return _pick(seconds, bfloat16.FLOAT32)


def _recurrent_candidates(lstm_plan, kernels, dtype_name):
  """The (forward, backward) pairs a LAYER or WAVEFRONT path can run."""
  if lstm_plan.paths[0] not in (plan_lib.WAVEFRONT, plan_lib.LAYER):
    return []
  pairs = [(plan_lib.MATMUL, b) for b in
           (plan_lib.TRANSPOSED, plan_lib.PLAIN, plan_lib.SWAPPED)]
  if kernels.isa and (dtype_name == bfloat16.FLOAT32 or kernels.bf16):
    pairs.append((plan_lib.KERNELS, plan_lib.KERNELS))
  return pairs


def _lstm_part(config, lstm_plan, kernels, dtype_name, repeats, timings,
               compare):
  """The LSTM's fastest choices in one dtype, and one layer's time (all its
  products if `compare`: another dtype is timed too)."""
  b, h, steps = config.batch_size, config.hidden_size, config.num_steps
  blocks = len(lstm_plan.input_gradients)
  rows = b * -(-steps // blocks)  # the largest time block's rows
  rules = (lstm_plan.forward, lstm_plan.backward)
  pairs = _recurrent_candidates(lstm_plan, kernels, dtype_name)
  gradients = (plan_lib.PLAIN, plan_lib.SWAPPED)
  if lstm_plan.paths[0] == plan_lib.WAVEFRONT and rules in pairs:
    # There the layers' products run side by side, each on a core, which
    # one chain timed on all the cores does not show (the how-to's class
    # trained 8 % slower on such a choice): the rules' paths are kept, and
    # timed for the dtypes' totals.
    pairs, gradients = [rules], lstm_plan.input_gradients[:1]
  time_of = _median_times({pair: recurrent_chain(dataclasses.replace(
      lstm_plan, forward=pair[0], backward=pair[1], products=dtype_name,
      isa=kernels.isa), b, h, steps) for pair in pairs}, repeats)
  recurrent = _pick(time_of, rules) if time_of else None
  grads = {s: blocks * t for s, t in _median_times(
      {s: transposed(rows, 4 * h, h, s == plan_lib.SWAPPED, dtype_name)
       for s in gradients}, repeats).items()}
  input_gradient = _pick(grads, lstm_plan.input_gradients[0])
  total = time_of.get(recurrent, 0.0) + grads[input_gradient]
  if compare:  # the products whose path is fixed, for the dtypes' totals
    total += (
        _median_seconds(product(b * steps, h, 4 * h, dtype_name), repeats) +
        _median_seconds(product(2 * h, b * steps, 4 * h, dtype_name,
                                transpose_a=True, isa=lstm_plan.isa),
                        repeats))
  timings["lstm_" + dtype_name] = {
      "recurrent": {"%s/%s" % k: v for k, v in time_of.items()},
      "input_gradient": grads, "layer": total}
  return recurrent, input_gradient, total


def _softmax_part(config, softmax_plan, dtype_name, repeats, timings,
                  compare):
  """The softmax layer's fastest input gradient in one dtype, and its time
  (all its products if `compare`)."""
  rows = config.batch_size * config.num_steps
  h, v = config.hidden_size, config.vocab_size
  grads = _median_times(
      {s: transposed(rows, v, h, s == plan_lib.SWAPPED, dtype_name)
       for s in (plan_lib.PLAIN, plan_lib.SWAPPED)}, repeats)
  choice = _pick(grads, softmax_plan.input_gradient)
  total = grads[choice]
  if compare:
    total += (_median_seconds(product(rows, h, v, dtype_name), repeats) +
              _median_seconds(product(h + 1, rows, v, dtype_name,
                                      transpose_a=True,
                                      isa=softmax_plan.isa), repeats))
  timings["softmax_" + dtype_name] = {"input_gradient": grads,
                                      "layer": total}
  return choice, total


def measure(config, estimates, kernels, repeats=REPEATS):
  """Times the candidates of the training step; (plan.Choices, timings).

  Args:
    config: the training config.
    estimates: {products' dtype: the rules' plan.Plan in that dtype}, the
      asked dtype first; with bfloat16 asked, float32 beside it.
    kernels: plan.Kernels.
    repeats: timed calls per candidate (their median counts).
  """
  dtypes, timings = list(estimates), {}
  asked = dtypes[0]
  compare = len(dtypes) > 1
  lstm = {d: _lstm_part(config, estimates[d].train.lstm, kernels, d, repeats,
                        timings, compare) for d in dtypes}
  # A part changes dtype only where both dtypes take the same path (BLOCK
  # without kernels runs BlockLSTM in float32, BASIC's cell in bfloat16).
  paths = {estimates[d].train.lstm.paths for d in dtypes}
  lstm_dtype = (_products_dtype({d: lstm[d][2] for d in dtypes})
                if len(paths) == 1 else asked)
  softmax = {d: _softmax_part(config, estimates[d].train.softmax, d, repeats,
                              timings, compare) for d in dtypes}
  softmax_dtype = _products_dtype({d: softmax[d][1] for d in dtypes})
  choices = plan_lib.Choices(
      recurrent=lstm[lstm_dtype][0], input_gradients=lstm[lstm_dtype][1],
      softmax_input_gradient=softmax[softmax_dtype][0],
      lstm_products=lstm_dtype, softmax_products=softmax_dtype)
  return choices, timings


def _read(path):
  """The Choices kept at `path`, or None if it is missing or unreadable."""
  try:
    with open(path) as f:
      kept = json.load(f)["choices"]
    if kept.get("recurrent"):
      kept["recurrent"] = tuple(kept["recurrent"])
    return plan_lib.Choices(**kept)
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _write(path, choices, timings, seconds):
  """Keeps the wisdom at `path` (written whole, then renamed into place)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".json")
  with os.fdopen(fd, "w") as f:
    json.dump({"choices": dataclasses.asdict(choices), "timings": timings,
               "seconds": seconds, "cpu": _cpu_model()[0],
               "tensorflow": tf.__version__}, f, indent=1, sort_keys=True)
  os.replace(tmp, path)


def make(mode, config, devices, dtype, kernels, workers=1, eval_config=None,
         eval_unroll=1, products=bfloat16.FLOAT32, directory=None,
         min_flops=MIN_FLOPS, log=sys.stderr):
  """The run's plan.Plan, by the rules or measured (see the docstring).

  Args:
    mode: "estimate" (the rules) or "measure".
    config, devices, dtype, kernels, workers, eval_config, eval_unroll,
      products: as plan.make's.
    directory: where wisdom is kept; None: beside the built kernels.
    min_flops: steps of fewer product FLOPs keep the rules.
    log: where the measuring says what it does.
  """
  args = (config, devices, dtype, kernels, workers, eval_config, eval_unroll)
  estimate = plan_lib.make(*args, products=products)
  if mode == "estimate":
    return estimate
  if any("GPU" in d.upper() for d in devices):
    why = "GPU towers: their libraries choose, the rules kept"
  elif dtype != tf.float32:
    why = "float16 variables: the rules kept"
  elif step_flops(config) < min_flops:
    why = "a step of %.2g product FLOPs: too small to time, the rules kept" % (
        step_flops(config))
  else:
    why = None
  if why:
    return plan_lib.make(*args, products=products, how=("measure", why))
  directory = directory or os.path.dirname(kernels_lib.library_path())
  path = os.path.join(directory, "plan-wisdom-%s.json" % wisdom_key(
      config, estimate, dtype, devices, workers))
  choices = _read(path)
  if choices is not None:
    why = "wisdom of %s" % path
  else:
    print("Plan: timing each product's paths at this config's shapes "
          "(once per machine and config)...", file=log, flush=True)
    start = time.perf_counter()
    estimates = {products: estimate}
    if products == bfloat16.BFLOAT16:
      estimates[bfloat16.FLOAT32] = plan_lib.make(*args)
    choices, timings = measure(config, estimates, kernels)
    seconds = time.perf_counter() - start
    try:
      _write(path, choices, timings, seconds)
      why = "timed in %.1f s, kept in %s" % (seconds, path)
    except OSError as e:  # a read-only cache: this run's choice alone
      why = "timed in %.1f s, not kept: %s" % (seconds, e)
  return plan_lib.make(*args, products=products, choices=choices,
                       how=("measure", why))
