"""The roofline of a training step: its FLOPs and bytes a word, and its picture.

A word of training does train_flops_per_word FLOPs of products and must
move train_bytes_per_word bytes to and from memory at the least; their
ratio, FLOPs per byte, places a run on the machine's roofline, whose roofs
are the memory bandwidth (a slope: GFLOP/s = GB/s x FLOPs per byte) and
the compute peaks (flat ceilings). roofline() gives a benchmark result's
figures against both roofs; figure() and draw() draw results of
benchmark.py (its --output_json, or this call's) as people draw a roofline,
log-log, one point a result.

The products' dtype is ptb/bfloat16.py's FLOAT32 or BFLOAT16: in bfloat16,
the products' operands are bfloat16, their sums float32, and the weights
keep float32 masters.
"""

import importlib.util
import json
import math
import os

from ptb import errors
from ptb import outputs
from ptb.bfloat16 import BFLOAT16, FLOAT32
from ptb.errors import UserError

PRODUCTS = (FLOAT32, BFLOAT16)

# Bytes a step moves for each element of a weight, at the least (see
# train_bytes_per_word): float32 reads it forward and backward and writes
# it; with bfloat16 products the forward pass reads a bfloat16 copy, the
# backward pass the float32 master (the update needs that read), and the
# update writes both.
_WEIGHT_BYTES = {FLOAT32: 4 + 4 + 4, BFLOAT16: 2 + 4 + 4 + 2}

# The figure: inches and dots per inch, as plot_run.py sizes its own.
_FIGSIZE = (9, 6.5)
_DPI = 120
# The formats that matplotlib's Agg canvas writes with no other package.
_FORMATS = ("png", "pdf", "svg")
_INSTALL = "pip install -r requirements-plot.txt"
_COLORS = {FLOAT32: "#2171b5", BFLOAT16: "#e6550d"}
# The limits a result may carry, with the legend's name of each; absent or
# None where it was not measured. The ceilings come first, each with its
# colour: a peak in the colour of its dtype's points.
_LIMITS = (("fma_peak_gflops", "float32 FMA peak"),
           ("bf16_peak_gflops", "bfloat16 peak"),
           ("ceiling_gflops", "TensorFlow float32 matmul"),
           ("bandwidth_gbs", "memory bandwidth"))
_CEILING_COLORS = {"fma_peak_gflops": _COLORS[FLOAT32],
                   "bf16_peak_gflops": _COLORS[BFLOAT16],
                   "ceiling_gflops": "0.45"}
# The numbers every drawn result needs, all of them positive.
_NEEDED = ("gflops", "train_flops_per_word", "train_bytes_per_word")


def train_flops_per_word(config):
  """Matrix-multiply FLOPs of one training word: forward, then twice that.

  Per layer the gates are `[input + hidden] x [4 * hidden]` (input = hidden
  here), the softmax `[hidden] x [vocab]`; the backward pass costs two such
  products per forward one. Elementwise work is left out.
  """
  h = config.hidden_size
  forward = config.num_layers * 2 * (2 * h) * (4 * h) + 2 * h * config.vocab_size
  return 3 * forward


def train_bytes_per_word(config, products=FLOAT32):
  """Bytes that one training word must move to and from memory, at the least.

  The roofline's model (docs/performance.md): in a step of batch x steps
  words, each dense weight (LSTM kernels and biases, softmax weights and
  bias) is read in the forward pass, read in the backward pass and written
  by the update, 12 bytes, its gradient never written out; the embedding
  rows of the step's words are read, then read and written by the update.
  Per word, the activations that the backward pass reads back are written
  once and read once: per layer the input, the four gates, the cell, its
  tanh and the output (8 x hidden floats) and the gates' gradient (4 x
  hidden); the logits are written, turned into their gradient in place and
  read by the two products of the backward pass (4 x vocab floats moved).

  With bfloat16 products (bfloat16 operands, float32 sums, float32 master
  weights), each product weight (the LSTM kernels, the softmax weights)
  still costs 12 bytes at the least: a bfloat16 copy read in the forward
  pass (2), the float32 master read in the backward pass, rounded as it is
  read, a read the update shares (4), and the master written with its new
  copy (4 + 2). The update must read the master, so a bfloat16 step moves
  no fewer bytes of weights than a float32 one: its gain is the compute
  roof, and the re-reads of a weight within a step (every time step's
  recurrent product), which this count leaves out and bfloat16 halves.
  The biases, the embedding and the activations stay float32: each
  product's output is cast back to float32 at once.

  Args:
    config: the model's config (hidden_size, vocab_size, num_layers,
      batch_size, num_steps).
    products: the products' dtype, "float32" or "bfloat16".

  Returns:
    The bytes, a float.
  """
  if products not in PRODUCTS:
    raise ValueError("products must be one of %s, not %r"
                     % (", ".join(PRODUCTS), products))
  h, v, layers = config.hidden_size, config.vocab_size, config.num_layers
  product_weights = layers * 2 * h * 4 * h + h * v
  biases = layers * 4 * h + v
  words = config.batch_size * config.num_steps
  weights = (_WEIGHT_BYTES[products] * product_weights +
             _WEIGHT_BYTES[FLOAT32] * biases) / words
  embedding = 12 * h
  activations = 4 * (layers * 2 * (8 * h + 4 * h) + 4 * v)
  return weights + embedding + activations


def roofline(r, config, peak, bandwidth, products=FLOAT32):
  """The roofline's figures of a benchmark result, unknown ones None.

  Args:
    r: the result, a dict with "wps" and "train_flops_per_word".
    config: the result's model config.
    peak: the compute peak in GFLOP/s of the products' dtype (the bfloat16
      peak for bfloat16 products), or None.
    bandwidth: the memory bandwidth in GB/s, or None.
    products: the products' dtype, "float32" or "bfloat16".

  Returns:
    A dict: bandwidth_gbs, train_bytes_per_word, gbs, bandwidth_fraction,
    compute_roof_wps, bandwidth_roof_wps, bound ("compute", "bandwidth" or
    None) and roof_fraction.
  """
  bytes_per_word = train_bytes_per_word(config, products)
  roofs = {"compute": peak * 1e9 / r["train_flops_per_word"] if peak else None,
           "bandwidth": (bandwidth * 1e9 / bytes_per_word if bandwidth
                         else None)}
  known = {k: v for k, v in roofs.items() if v is not None}
  bound = min(known, key=known.get) if known else None
  return {"bandwidth_gbs": bandwidth, "train_bytes_per_word": bytes_per_word,
          "gbs": r["wps"] * bytes_per_word / 1e9,
          "bandwidth_fraction": (r["wps"] * bytes_per_word / 1e9 / bandwidth
                                 if bandwidth else None),
          "compute_roof_wps": roofs["compute"],
          "bandwidth_roof_wps": roofs["bandwidth"], "bound": bound,
          "roof_fraction": r["wps"] / known[bound] if bound else None}


def cpu_model(path="/proc/cpuinfo"):
  """The CPU's model name from `path` (Linux's cpuinfo), or None."""
  try:
    with open(path, errors="replace") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
          return value.strip()
  except OSError:
    return None
  return None


def check_output(flag, path):
  """Refuses, before any work, a picture that could not be drawn or written.

  Checked without importing matplotlib, which would count in a benchmark's
  peak RSS: whether it is installed, the file's extension, and (as every
  output's) whether the file can be written.

  Raises:
    UserError: the one line to print.
  """
  outputs.check_file(flag, path)
  extension = os.path.splitext(path)[1][1:].lower()
  if extension not in _FORMATS:
    raise UserError("--%s=%s: give a file name ending in .%s"
                    % (flag, path, ", .".join(_FORMATS)), exit_code=2)
  if importlib.util.find_spec("matplotlib") is None:
    raise _no_matplotlib()


def _no_matplotlib():
  """The error of drawing without matplotlib."""
  return UserError("drawing the roofline needs matplotlib, which is not "
                   "installed: %s" % _INSTALL)


def _number(value):
  """Whether `value` is a finite number (a bool is none)."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _check_result(r, where):
  """Refuses a result that cannot be drawn; `where` names it in the error."""
  if not isinstance(r, dict) or not isinstance(r.get("model"), str):
    raise UserError("%s is not a result of benchmark.py: it has no model"
                    % where, exit_code=2)
  for key in _NEEDED:
    if not _number(r.get(key)) or r[key] <= 0:
      raise UserError("%s has no positive %s" % (where, key), exit_code=2)
  for key, _ in _LIMITS:
    if r.get(key) is not None and not (_number(r[key]) and r[key] > 0):
      raise UserError("%s has a %s that is no positive number: %r"
                      % (where, key, r[key]), exit_code=2)
  if r.get("products", FLOAT32) not in PRODUCTS:
    raise UserError("%s has products=%r; it must be %s" % (
        where, r["products"], " or ".join(PRODUCTS)), exit_code=2)


def load_results(paths, flag="roofline_from"):
  """The results of benchmark.py's --output_json files, to draw.

  Each result is a copy that also carries its file's "cpu" and
  "tensorflow" (where the file has them and the result does not).

  Args:
    paths: the JSON files.
    flag: the flag that named them, for the errors.

  Returns:
    A list of result dicts, in the files' order.

  Raises:
    UserError: a file cannot be read, is not JSON, or is not benchmark.py's
      (exit code 2).
  """
  results = []
  for path in paths:
    shown = "--%s=%s" % (flag, path)
    try:
      with open(path, "rb") as f:
        report = json.loads(f.read().decode("utf-8"))
    except OSError as e:
      raise UserError("%s cannot be read: %s" % (shown, e.strerror or e),
                      exit_code=2) from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
      raise UserError("%s is not JSON: %s" % (shown, e),
                      exit_code=2) from None
    if not isinstance(report, dict) or not isinstance(report.get("results"),
                                                      list):
      raise UserError("%s is not benchmark.py's --output_json: it has no "
                      "list of \"results\"" % shown, exit_code=2)
    if not report["results"]:
      raise UserError("%s has no results to draw" % shown, exit_code=2)
    for i, r in enumerate(report["results"]):
      _check_result(r, "%s: result %d" % (shown, i + 1))
      r = dict(r)
      for key in ("cpu", "tensorflow"):
        if report.get(key) is not None:
          r.setdefault(key, report[key])
      results.append(r)
  return results


def limits(results):
  """The highest measured value of each limit across `results`.

  As benchmark.py keeps the better of two measurements: the machine's
  limit is what it reached at its best.

  Returns:
    A dict from each limit's key ("fma_peak_gflops", "bf16_peak_gflops",
    "ceiling_gflops", "bandwidth_gbs") to its value, None where no result
    has it.
  """
  best = {}
  for key, _ in _LIMITS:
    known = [r[key] for r in results if r.get(key) is not None]
    best[key] = max(known) if known else None
  return best


def intensity(r):
  """A result's FLOPs per byte: its x on the roofline."""
  return r["train_flops_per_word"] / r["train_bytes_per_word"]


def _labels(results):
  """Each result's label: model, its config overrides and products, with
  rnn_mode where needed."""
  base = ["%s%s %s" % (r["model"], " (%s)" % r["config_overrides"]
                       if r.get("config_overrides") else "",
                       r.get("products", FLOAT32)) for r in results]
  return [b + (" %s" % r["rnn_mode"] if base.count(b) > 1 and
               r.get("rnn_mode") else "") for b, r in zip(base, results)]


def _title(results, cpu):
  """The CPU's name and the TensorFlow versions the results carry."""
  names = sorted({str(r["cpu"]) for r in results if r.get("cpu")})
  name = cpu or " / ".join(names) or cpu_model() or "unknown CPU"
  versions = sorted({str(r["tensorflow"]) for r in results
                     if r.get("tensorflow")})
  return "Roofline: %s%s" % (name, ", TensorFlow %s" % ", ".join(versions)
                             if versions else "")


def _plain_log_labels(ax):
  """Labels both log axes 10, 200, 1000 rather than in powers of ten.

  matplotlib's plain LogFormatter, which labels the minor ticks only where
  an axis spans little, as its default one does.
  """
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  for axis in (ax.xaxis, ax.yaxis):
    axis.set_major_formatter(ticker.LogFormatter())
    axis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))


def _draw_roofs(ax, best, x_lo, x_hi, bf16=False):
  """Draws the roofs of the limits `best` (see limits()) from x_lo to x_hi.

  The bandwidth's slope rises to the highest ceiling; each ceiling runs
  flat from its ridge point, where the slope meets it (from x_lo without a
  bandwidth). An unknown FMA peak or bandwidth, or bfloat16 peak where
  `bf16` (a bfloat16 result is drawn), is a legend entry alone.
  """
  bandwidth = best["bandwidth_gbs"]
  ceilings = [(key, name, best[key]) for key, name in _LIMITS[:3]
              if best[key] is not None]
  if bandwidth:
    x_top = (max(peak for _, _, peak in ceilings) / bandwidth if ceilings
             else x_hi)
    ax.plot([x_lo, x_top], [bandwidth * x_lo, bandwidth * x_top],
            color="0.2", lw=2, gid="bandwidth",
            label="memory bandwidth %.1f GB/s" % bandwidth)
    ax.annotate("%.1f GB/s" % bandwidth, (x_lo, bandwidth * x_lo),
                xytext=(8, 0), textcoords="offset points", fontsize=8,
                color="0.2")
  for key, name, peak in ceilings:
    dashed = key == "ceiling_gflops"
    ax.plot([peak / bandwidth if bandwidth else x_lo, x_hi], [peak, peak],
            color=_CEILING_COLORS[key], lw=1.5 if dashed else 2,
            ls="--" if dashed else "-", gid=key,
            label="%s %.1f GFLOP/s" % (name, peak))
    ax.annotate("%s %.1f GFLOP/s" % (name, peak), (x_hi, peak),
                xytext=(-4, 3), textcoords="offset points", ha="right",
                va="bottom", fontsize=8, color=_CEILING_COLORS[key])
  for key, name in (_LIMITS[0], _LIMITS[3]) + (_LIMITS[1:2] if bf16 else ()):
    if best[key] is None:  # a legend entry with no line
      ax.plot([], [], " ", label="%s unknown" % name)


def figure(results, cpu=None):
  """The machine's roofline with `results` on it, a matplotlib Figure.

  Log-log: x is FLOPs per byte (intensity()), y GFLOP/s. The bandwidth's
  slope, y = bandwidth_gbs * x, rises to the highest ceiling; each ceiling
  is flat from where the slope meets it: the float32 FMA peak, the
  bfloat16 peak where a result has one, and TensorFlow's float32 matmul
  ceiling, dashed. Each limit is the highest across the results (limits());
  an unknown peak or bandwidth says so in the legend. Each result is a
  point at (intensity(r), r["gflops"]) labelled with its model and
  products' dtype (a result without "products" is float32).

  Args:
    results: result dicts of benchmark.py, at least one.
    cpu: the CPU's name for the title; by default the results' "cpu", else
      this machine's (cpu_model()).

  Returns:
    The Figure, on the Agg canvas. Its lines have gids: "bandwidth",
    "fma_peak_gflops", "bf16_peak_gflops", "ceiling_gflops", "result".

  Raises:
    UserError: matplotlib is not installed.
    ValueError: `results` is empty.
  """
  if not results:
    raise ValueError("a roofline needs a result to draw")
  try:
    # pylint: disable=g-import-not-at-top
    # Here, not at the top: matplotlib is no requirement of the training.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
  except ImportError:
    raise _no_matplotlib() from None
  # A Figure of its own canvas, not pyplot's: nothing global to close.
  fig = Figure(figsize=_FIGSIZE, dpi=_DPI, layout="constrained")
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  ax.set_xscale("log")
  ax.set_yscale("log")
  best = limits(results)
  bandwidth = best["bandwidth_gbs"]
  xs = [intensity(r) for r in results]
  ys = [r["gflops"] for r in results]
  peaks = [best[key] for key, _ in _LIMITS[:3] if best[key] is not None]
  # Where the slope meets each ceiling: the ridge points.
  ridges = [peak / bandwidth for peak in peaks] if bandwidth else []
  x_lo, x_hi = min(xs + ridges) / 4, max(xs + ridges) * 4
  _draw_roofs(ax, best, x_lo, x_hi,
              any(r.get("products") == BFLOAT16 for r in results))
  for x, y, label, r in zip(xs, ys, _labels(results), results):
    ax.plot([x], [y], "o", ms=7, gid="result", label=label,
            color=_COLORS[r.get("products", FLOAT32)])
    ax.annotate(label, (x, y), xytext=(6, -10), textcoords="offset points",
                fontsize=9)
  y_lo = min(ys + ([bandwidth * x_lo] if bandwidth else [])) / 2
  ax.set_xlim(x_lo, x_hi)
  ax.set_ylim(y_lo, max(ys + peaks) * 2)
  ax.set_xlabel("FLOPs per byte (train_flops_per_word / "
                "train_bytes_per_word)")
  ax.set_ylabel("GFLOP/s")
  _plain_log_labels(ax)
  ax.grid(True, which="both", alpha=0.25)
  ax.legend(loc="lower right", fontsize=8)
  ax.set_title(_title(results, cpu), fontsize=11)
  return fig


def draw(results, path, cpu=None, flag="roofline"):
  """Writes figure(results, cpu) to `path` (its extension the format).

  Raises:
    UserError: matplotlib is not installed, or the file cannot be written.
  """
  fig = figure(results, cpu)
  try:
    # outputs.check_file allowed a directory still to be made.
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=_DPI)
  except OSError as e:
    raise UserError("--%s=%s cannot be written: %s" % (
        flag, path, errors.write_failure(e))) from None
  return path
