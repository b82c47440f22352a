"""Draws one PNG from a training run's summary JSON and memory CSV.

  python plot_run.py --summary_json=run/summary.json \\
      --memory_csv=run/memory.csv --output=run/run.png

The top panel shows RSS over wall time with the run's phases shaded; below
are training speed per epoch and perplexities per epoch. Summaries of runs
that were killed (no epochs, no test perplexity) still plot.
"""

import csv
import io
import json
import math
import os
import sys

from absl import flags

from ptb import outputs
from ptb.errors import UserError

# Its own flag registry, not absl's global one: ptb_word_lm.py defines a
# --summary_json too, and both modules load together in one test process.
FLAGS = flags.FlagValues()
flags.DEFINE_string("summary_json", None, "Run summary written by "
                    "ptb_word_lm.py.", flag_values=FLAGS)
flags.DEFINE_string("memory_csv", None, "Memory log written by "
                    "monitor.MemorySampler; optional.", flag_values=FLAGS)
flags.DEFINE_string("output", None, "PNG file to write.", flag_values=FLAGS)
flags.mark_flags_as_required(["summary_json", "output"], flag_values=FLAGS)

_PROGRAM = "plot_run.py"
_MIB = 1024.0 * 1024.0
_DPI = 120
_SPEED_COLOR = "#6baed6"
_PART_WAY_COLOR = "#b3cde3"
_FIGSIZE = (11, 9)

_PHASE_COLORS = {
    "startup": "#d9d9d9",
    "train": "#c6dbef",
    "valid": "#fdd0a2",
    "test": "#c7e9c0",
}
# For phases the tool does not know, so they are still told apart.
_EXTRA_PHASE_COLORS = ("#dadaeb", "#fcbba1", "#f6e8c3", "#c7eae5")
_GPU_SUFFIX = "_bytes_in_use"


class InputError(UserError):
  """An input file is missing or cannot be parsed (exit status 1)."""


def _pyplot():
  """Imports pyplot with a file-only backend.

  Imported here rather than at the top so that a bad input is reported
  without paying matplotlib's import, or its first-run font-cache message.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _text(data, path, what):
  """`data`, bytes read from `path`, as UTF-8 text.

  Raises:
    InputError: the bytes are not text, as those of a compressed file.
  """
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise InputError("%s %s is not text (compressed?): invalid byte 0x%02x "
                     "at byte offset %d" % (what, path, data[e.start],
                                            e.start)) from None


def load_summary(path):
  """Reads the run summary JSON into a dict.

  Raises:
    InputError: if the file is unreadable, not JSON, or not a summary.
  """
  try:
    with open(path, "rb") as f:
      summary = json.loads(_text(f.read(), path, "summary JSON"))
  except OSError as e:
    raise InputError("cannot read summary JSON %s: %s" % (path, e)) from e
  except ValueError as e:
    raise InputError("summary JSON %s is not valid JSON: %s"
                     % (path, e)) from e
  # Another program's JSON (benchmark.py's --output_json, say) would plot
  # as an empty figure: every summary has a list of epochs, empty or not.
  if not isinstance(summary, dict) or not isinstance(summary.get("epochs"),
                                                     list):
    raise InputError("summary JSON %s is not a run summary of "
                     "ptb_word_lm.py --summary_json: it has no list of "
                     "\"epochs\"" % path)
  return summary


def load_memory_csv(path):
  """Reads a MemorySampler CSV into a list of dict rows.

  Rows that do not parse (the last line of a killed run may be cut short)
  are skipped.

  Raises:
    InputError: if the file is unreadable, not text, or has no
      seconds/rss_mib columns.
  """
  try:
    with open(path, "rb") as f:
      text = _text(f.read(), path, "memory CSV")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if not {"seconds", "rss_mib"} <= set(reader.fieldnames or ()):
      raise InputError("memory CSV %s lacks seconds,rss_mib columns" % path)
    rows = list(reader)
  except (OSError, csv.Error) as e:
    raise InputError("cannot read memory CSV %s: %s" % (path, e)) from e
  return [row for row in rows if _float(row.get("seconds")) is not None
          and _float(row.get("rss_mib")) is not None]


def _float(value):
  """Returns `value` as a finite float, or None if it is not one."""
  try:
    result = float(value)
  except (TypeError, ValueError):
    return None
  return result if math.isfinite(result) else None


def _phase_spans(times, phases):
  """Groups consecutive samples of one phase into (phase, start, end) spans.

  A phase is taken to last until the first sample of the next one: the
  sampler only sees where the program is at each sample.
  """
  spans = []
  for t, phase in zip(times, phases):
    if spans and spans[-1][0] == phase:
      continue
    if spans:
      spans[-1][2] = t
    spans.append([phase, t, times[-1]])
  return [tuple(span) for span in spans]


def _resume_times(spans):
  """Where the processes of a resumed run begin, after the first one.

  A resumed run appends to its memory log, starting with a start-up phase;
  its few seconds would not show as a span on an axis of hours.
  """
  return [start for phase, start, _ in spans[1:] if phase == "startup"]


def _phase_colors(phases):
  """Maps each phase to a colour: fixed ones for known phases, spares else."""
  colors = {}
  spare = 0
  for phase in phases:
    if phase in colors:
      continue
    if phase in _PHASE_COLORS:
      colors[phase] = _PHASE_COLORS[phase]
    else:
      colors[phase] = _EXTRA_PHASE_COLORS[spare % len(_EXTRA_PHASE_COLORS)]
      spare += 1
  return colors


def _no_data(ax, text):
  """Leaves a panel empty but for a centred note."""
  ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes,
          fontsize=12, color="0.4")
  ax.set_xticks([])
  ax.set_yticks([])


def _plot_memory(ax, rows, summary_peak):
  """Panel 1: RSS (and GPU memory) over wall time, phases shaded."""
  ax.set_title("Memory over the run", loc="left", fontsize=11)
  rows = [r for r in rows or ()
          if _float(r.get("seconds")) is not None
          and _float(r.get("rss_mib")) is not None]
  if not rows:
    _no_data(ax, "no memory log")
    return
  times = [_float(r["seconds"]) for r in rows]
  rss = [_float(r["rss_mib"]) for r in rows]
  phases = [str(r.get("phase") or "unknown") for r in rows]

  colors = _phase_colors(phases)
  seen = set()
  spans = _phase_spans(times, phases)
  for phase, start, end in spans:
    label = None if phase in seen else phase
    seen.add(phase)
    ax.axvspan(start, end, color=colors[phase],
               alpha=0.8, lw=0, label=label, zorder=0)
  for i, start in enumerate(_resume_times(spans)):
    ax.axvline(start, color="0.35", ls="--", lw=1, zorder=2,
               label=None if i else "resumed")

  ax.plot(times, rss, color="#08306b", lw=1.6, label="RSS", zorder=3)
  top = max(rss)
  for column in sorted(rows[0]):
    if column.endswith(_GPU_SUFFIX):
      top = max(top, _plot_gpu(ax, times, rows, column))

  _annotate_peak(ax, times, rss)
  if summary_peak is not None and summary_peak > max(rss) + 0.5:
    # getrusage's peak can fall between two samples.
    ax.axhline(summary_peak, color="#08306b", ls=":", lw=1,
               label="peak RSS (getrusage)", zorder=2)
    top = max(top, summary_peak)

  ax.set_xlim(times[0], max(times[-1], times[0] + 1.0))
  ax.set_ylim(0, top * 1.18)
  ax.set_xlabel("wall time (s)")
  has_gpu = any(c.endswith(_GPU_SUFFIX) for c in rows[0])
  ax.set_ylabel("RSS / GPU memory (MiB)" if has_gpu else "RSS (MiB)")
  ax.grid(True, axis="y", alpha=0.3)
  # Above the axes, beside the panel title, so it never hides the curve.
  ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=8,
            fontsize=9, frameon=False, handlelength=1.5, columnspacing=1.2,
            borderaxespad=0.2)


def _plot_gpu(ax, times, rows, column):
  """Draws one GPU's bytes in use in MiB; returns its largest value."""
  values = [_float(r.get(column)) for r in rows]
  mib = [math.nan if v is None else v / _MIB for v in values]
  name = column[:-len(_GPU_SUFFIX)]
  ax.plot(times, mib, lw=1.4, ls="--", label="%s in use" % name, zorder=3)
  finite = [v for v in mib if not math.isnan(v)]
  return max(finite) if finite else 0.0


def _annotate_peak(ax, times, rss):
  """Marks the highest sampled RSS with its value."""
  peak_index = max(range(len(rss)), key=rss.__getitem__)
  t, peak = times[peak_index], rss[peak_index]
  span = (times[-1] - times[0]) or 1.0
  # Keep the label inside the axes when the peak is near the right edge.
  right_half = (t - times[0]) > span / 2
  ax.plot([t], [peak], "o", color="#cb181d", ms=5, zorder=4)
  ax.annotate("sampled peak %.0f MiB" % peak, (t, peak),
              xytext=(-8 if right_half else 8, 8), textcoords="offset points",
              ha="right" if right_half else "left", va="bottom",
              fontsize=9, color="#cb181d", zorder=5,
              bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none",
                        alpha=0.8))


def _epoch_values(epochs, key):
  """Returns (epochs, values) for epochs whose `key` is a finite number."""
  xs, ys = [], []
  for i, entry in enumerate(epochs):
    value = _float(entry.get(key))
    if value is not None:
      xs.append(entry.get("epoch", i + 1))
      ys.append(value)
  return xs, ys


def _integer_epochs(ax, xs):
  """Whole-epoch ticks; one epoch alone would otherwise get 0.95, 1.05."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
  if len(xs) <= 20:
    ax.set_xticks(sorted(set(xs)))
  else:
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


def _plain_log_labels(ax):
  """Labels a log y axis 100, 150, 200 rather than 1.5x10^2."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  plain = ticker.FuncFormatter(lambda y, _: "%g" % y)
  ax.yaxis.set_major_formatter(plain)
  ax.yaxis.set_minor_formatter(plain)


def _resumed_part_way(summary):
  """The epochs whose training pass a resume entered part-way.

  Such an epoch's train_wps counts only the steps of its last process, from
  the resume's step on.
  """
  epochs = set()
  for resume in summary.get("resumes") or ():
    if isinstance(resume, dict) and (_float(resume.get("step")) or 0) > 0:
      epochs.add(resume.get("epoch"))
  return epochs


def _plot_speed(ax, epochs, part_way=frozenset()):
  """Panel 2: training words per second per epoch.

  Epochs in `part_way` (resumed part-way) are drawn lighter, hatched.
  """
  ax.set_title("Training speed", loc="left", fontsize=11)
  xs, wps = _epoch_values(epochs, "train_wps")
  if not xs:
    _no_data(ax, "no finished epoch")
    return
  part = [x in part_way for x in xs]
  bars = ax.bar(xs, wps, width=0.6,
                color=[_PART_WAY_COLOR if p else _SPEED_COLOR for p in part])
  labelled = False
  for bar, p in zip(bars, part):
    if p:
      bar.set_hatch("//")
      bar.set_edgecolor("white")
      if not labelled:
        bar.set_label("resumed part-way: the last process's steps only")
        labelled = True
  if labelled:
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False, borderaxespad=0.2)
  if len(xs) <= 20:  # beyond, the labels overlap
    ax.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
  _integer_epochs(ax, xs)
  ax.set_ylim(0, max(wps) * 1.15)
  ax.set_xlabel("epoch")
  ax.set_ylabel("train speed (words/s)")
  ax.grid(True, axis="y", alpha=0.3)


def _plot_perplexity(ax, epochs, test_perplexity):
  """Panel 3: train and valid perplexity per epoch, test as a line."""
  ax.set_title("Perplexity", loc="left", fontsize=11)
  series = [("train", "train_perplexity", "#2171b5"),
            ("valid", "valid_perplexity", "#e6550d")]
  plotted = False
  all_xs = []
  for label, key, color in series:
    xs, ys = _epoch_values(epochs, key)
    all_xs += xs
    ys_positive = [(x, y) for x, y in zip(xs, ys) if y > 0]
    if ys_positive:
      ax.plot(*zip(*ys_positive), "o-", color=color, ms=5, label=label)
      plotted = True
  if test_perplexity is not None and test_perplexity > 0:
    ax.axhline(test_perplexity, color="#31a354", ls="--", lw=1.5,
               label="test %.1f" % test_perplexity)
    plotted = True
  if not plotted:
    _no_data(ax, "no perplexity yet")
    return
  ax.set_yscale("log")
  _plain_log_labels(ax)
  if all_xs:
    _integer_epochs(ax, all_xs)
  ax.set_xlabel("epoch")
  ax.set_ylabel("perplexity")
  ax.grid(True, which="both", axis="y", alpha=0.3)
  ax.legend(fontsize=9)


def _title(summary, rows):
  """Builds the figure title from what the summary has."""
  setup = [text % summary[key] for key, text in
           (("model", "model %s"), ("rnn_mode", "rnn_mode %s"),
            ("tensorflow_version", "TF %s")) if summary.get(key)]
  results = []
  test = _float(summary.get("test_perplexity"))
  if test is not None:
    results.append("test perplexity %.1f" % test)
  peak = _float(summary.get("peak_rss_mib"))
  if peak is None and rows:
    peak = max((_float(r.get("rss_mib")) or 0.0) for r in rows) or None
  if peak is not None:
    results.append("peak RSS %.0f MiB" % peak)
  parts = ["PTB LSTM"] + [", ".join(p) for p in (setup, results) if p]
  return " \u2014 ".join(parts)


def _subtitle(summary):
  """A second, smaller title line: status, wall time and devices."""
  parts = []
  if summary.get("status"):
    parts.append("status: %s" % summary["status"])
  wall = _float(summary.get("wall_seconds"))
  if wall is not None:
    parts.append("wall time %.0f s (%.1f min)" % (wall, wall / 60.0))
  if summary.get("devices"):
    parts.append("devices: %s" % ", ".join(map(str, summary["devices"])))
  return ";  ".join(parts)


def plot_run(summary, memory_rows, output_path):
  """Writes the run's figure as a PNG.

  Args:
    summary: the parsed summary JSON (a dict; missing keys are skipped).
    memory_rows: dict rows of the memory CSV (values may be strings), or
      None when there is no memory log.
    output_path: PNG file to write.

  Returns:
    `output_path`.
  """
  plt = _pyplot()
  epochs = [e for e in summary.get("epochs") or () if isinstance(e, dict)]
  fig = plt.figure(figsize=_FIGSIZE, dpi=_DPI, layout="constrained")
  try:
    grid = fig.add_gridspec(2, 2, height_ratios=(1.15, 1))
    _plot_memory(fig.add_subplot(grid[0, :]), memory_rows,
                 _float(summary.get("peak_rss_mib")))
    _plot_speed(fig.add_subplot(grid[1, 0]), epochs,
                _resumed_part_way(summary))
    _plot_perplexity(fig.add_subplot(grid[1, 1]), epochs,
                     _float(summary.get("test_perplexity")))
    subtitle = _subtitle(summary)
    title = _title(summary, memory_rows)
    fig.suptitle(title + ("\n" + subtitle if subtitle else ""),
                 fontsize=12)
    fig.savefig(output_path, dpi=_DPI)
  finally:
    plt.close(fig)
  return output_path


def _error(message, exit_code=1):
  """Prints the one error line; returns the exit status."""
  print("%s: error: %s" % (_PROGRAM, message), file=sys.stderr)
  return exit_code


def check_format(path):
  """Refuses an --output whose extension matplotlib cannot write.

  Checked once the inputs are read and before the figure is drawn, as it
  imports matplotlib; a name without an extension gets ".png" from it.
  """
  # pylint: disable=g-import-not-at-top
  from matplotlib.backend_bases import FigureCanvasBase
  extension = os.path.splitext(path)[1][1:].lower()
  formats = FigureCanvasBase.get_supported_filetypes()
  if extension and extension not in formats:
    raise UserError("--output=%s: matplotlib writes no .%s files; it "
                    "writes .%s" % (path, extension,
                                    ", .".join(sorted(formats))),
                    exit_code=2)


def main(argv):
  if len(argv) > 1:
    return _error("unexpected arguments: %s" % " ".join(argv[1:]), 2)
  # The output first: a name that cannot be written is refused before
  # anything is read or drawn.
  try:
    outputs.check_file("output", FLAGS.output)
    outputs.check_distinct({"output": FLAGS.output}, inputs=[
        (f, FLAGS[f].value) for f in ("summary_json", "memory_csv")
        if FLAGS[f].value])
    summary = load_summary(FLAGS.summary_json)
    rows = load_memory_csv(FLAGS.memory_csv) if FLAGS.memory_csv else None
    check_format(FLAGS.output)
  except UserError as e:
    return _error(str(e), e.exit_code)
  try:
    # check_file allows a directory still to be made, as the other
    # scripts' outputs do; matplotlib makes none.
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)),
                exist_ok=True)
    plot_run(summary, rows, FLAGS.output)
  except OSError as e:
    return _error("cannot write %s: %s" % (FLAGS.output, e))
  return 0


def run(argv):
  """Parses the flags in `argv` and runs main; returns the exit status."""
  if any(a in ("-h", "--help", "-?", "--helpfull") for a in argv[1:]):
    print(__doc__)
    print(FLAGS.get_help())
    return 0
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    return _error(" ".join(str(e).split()), 2)
  return main(rest)


if __name__ == "__main__":
  sys.exit(run(sys.argv))
