"""Where a training step's time goes, part by part (benchmark.py --profile).

TensorFlow's own step statistics (a session call with FULL_TRACE) give
every op's start and end on every thread. Each op belongs to one part of
the step, by its type and, for the products, by its operands' shapes
against the config:

  input products      x_t @ w_x of a block of time steps (rows > batch)
  recurrent products  h @ w_h and d_gates @ w_h^T, one step's rows (batch)
  softmax products    the logits and their two gradients (a vocab dimension)
  gradient products   the LSTM's other products of the backward pass
  cell                the LSTM cell's elementwise ops, fused or not
  softmax loss        the loss over the logits and its gradient
  update              the global norm, the clipping and the SGD update
  casts and packing   dtype casts, transposed copies, the kernels' panels
  other               the rest (slices, stacks, dropout masks, the input)

The step's wall time is shared out instant by instant: while n ops run at
once, each part gets its ops' share of that instant. The parts then add up
to the time some op was running, which is the step but for the gaps
between ops.
"""

import collections

import tensorflow as tf

PARTS = ("input products", "recurrent products", "softmax products",
         "gradient products", "cell", "softmax loss", "update",
         "casts and packing", "other")

_PRODUCTS = {"MatMul", "_MklMatMul", "BatchMatMulV2", "_MklBatchMatMulV2",
             "PanelMatMul", "PanelMatMulBf16", "_FusedMatMul",
             "_MklFusedMatMul", "_MklNativeFusedMatMul", "_MklNativeMatMul",
             "BlockLSTM", "BlockLSTMV2", "BlockLSTMGrad", "BlockLSTMGradV2",
             "CudnnRNNV3", "CudnnRNNBackpropV3"}
_CELL = {"Sigmoid", "Tanh", "Mul", "_MklMul", "AddV2", "_MklAddV2", "Sub",
         "SigmoidGrad", "TanhGrad", "LstmCell", "LSTMBlockCell",
         "LSTMBlockCellGrad", "BiasAdd", "BiasAddGrad", "AddN", "_MklAddN"}
_LOSS = {"SoftmaxCrossEntropy", "SparseSoftmaxCrossEntropyWithLogits",
         "Softmax", "LogSoftmax", "Exp", "Log"}
_UPDATE = {"ResourceApplyGradientDescent", "ApplyOuterProduct",
           "ResourceScatterAdd", "L2Loss", "ResourceScatterSub"}
_CASTS = {"Cast", "_MklTranspose", "Transpose", "PackPanels",
          "PackPanelsBf16", "Snapshot"}


def part(op_type, shapes, dims, name=""):
  """The part of the step that an op belongs to.

  Args:
    op_type: the op's type as the trace names it (oneDNN's _Mkl ones too).
    shapes: its inputs' and outputs' static shapes, lists of ints or None.
    dims: {"batch", "hidden", "vocab"} of the config.
    name: the op's name (the update's scopes, the backward pass's).
  """
  if op_type in _PRODUCTS:
    sizes = {d for shape in shapes if shape for d in shape}
    if dims["vocab"] in sizes:
      return "softmax products"
    # One time step's product: the batch is a side of its output (its
    # rows, or its columns where the product is computed transposed).
    out = shapes[-1] if shapes else None
    if out and len(out) >= 2 and dims["batch"] in out[-2:]:
      return "recurrent products"
    return "gradient products" if "gradients" in name else "input products"
  if "global_norm" in name or "GradientDescent" in name or op_type in _UPDATE:
    return "update"
  if op_type in _LOSS:
    return "softmax loss"
  if op_type in _CELL:
    return "cell"
  if op_type in _CASTS:
    return "casts and packing"
  return "other"


def _op_type(label):
  """The op's type from a node's timeline label ("name = Type(inputs)")."""
  return label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else ""


def _shapes(graph, name):
  """The static shapes of an op's inputs and outputs, [] if not in graph."""
  try:
    op = graph.get_operation_by_name(name)
  except (KeyError, ValueError):
    return []
  return [t.shape.as_list() if t.shape.rank is not None else None
          for t in list(op.inputs) + list(op.outputs)]


def intervals(graph, run_metadata, dims):
  """(start, end, part) in seconds of every op the traced call ran."""
  out = []
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      if node.all_end_rel_micros <= 0 or node.node_name == "_SOURCE":
        continue
      name = node.node_name.split(":")[0]
      kind = part(_op_type(node.timeline_label), _shapes(graph, name), dims,
                  name)
      start = node.all_start_micros * 1e-6
      out.append((start, start + node.all_end_rel_micros * 1e-6, kind))
  return out


def shares(spans):
  """Each part's seconds of the wall time, and the step's span.

  Args:
    spans: (start, end, part) of every op.

  Returns:
    ({part: seconds}, busy seconds (some op running), the span from the
    first start to the last end).
  """
  # A sweep over the ops' starts and ends, counting the ops of each part
  # that run between two consecutive events.
  events = sorted([(s, 1, k) for s, _, k in spans] +
                  [(e, -1, k) for _, e, k in spans])
  seconds = collections.Counter()
  running = collections.Counter()
  busy, last = 0.0, None
  for t, change, k in events:
    total = sum(running.values())
    if total and t > last:
      busy += t - last
      for kind, n in running.items():
        seconds[kind] += (t - last) * n / total
    running[k] += change
    last = t
  span = (max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
          if spans else 0.0)
  return {k: seconds.get(k, 0.0) for k in PARTS}, busy, span


def trace(session, fetches):
  """One session call of `fetches` with FULL_TRACE; its RunMetadata."""
  metadata = tf.compat.v1.RunMetadata()
  session.run(fetches, options=tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
              run_metadata=metadata)
  return metadata


def line(seconds, busy, step):
  """The profile's line: each part's share of the step."""
  parts = ", ".join("%s %.1f%%" % (k, 100 * v / step)
                    for k, v in seconds.items() if v > 0)
  return ("profile: %s; the parts add up to %.3f s of the traced step's "
          "%.3f s" % (parts, busy, step))


def draw(seconds, step, title, path):
  """A bar per part, its share of the step, as a PNG at `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  names = [k for k in PARTS if seconds[k] > 0]
  figure, axes = pyplot.subplots(figsize=(7, 0.45 * len(names) + 1.2))
  values = [100 * seconds[k] / step for k in names]
  axes.barh(names[::-1], values[::-1], color="#4878a8")
  for y, v in enumerate(values[::-1]):
    axes.text(v + 0.5, y, "%.1f%%" % v, va="center", fontsize=8)
  axes.set_xlabel("share of the training step (%.0f ms)" % (1e3 * step))
  axes.set_title(title, fontsize=9)
  axes.set_xlim(0, max(values) * 1.15 + 1)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  pyplot.close(figure)
