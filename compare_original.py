"""The 2018 original and this port, from the same weights, line by line.

Runs the original tutorial on TensorFlow 1.5.1 (its three files from
--original, in a Python 3.6 virtualenv made on first use), then this port,
on the same config, corpus and initial weights, and prints their progress,
epoch and test lines side by side with their ratios, and both speeds:

  python compare_original.py --original=DIR --model=small --epochs=13
  python compare_original.py --original=DIR --model=large --fraction=0.2 \
      --config_overrides=keep_prob=1

Both run as the original ran on a CPU: --num_gpus=0, which made it force
BASIC and start every training step from a zero state (the port's
--train_from_zero_state). The original takes its config from a copy of its
files whose class is edited in place (the edit is printed as a diff), and
its initial weights from a checkpoint of the port's seeded ones under the
original's names in its --save_path, which its Supervisor restores; the
port reads the same checkpoint (--init_from). Given a --save_path, the
original's Supervisor also took a window of its training and validation
inputs at the start and every 120 s (ptb/summary_thread.py); the port
skips the windows it took, read from its event files
(--original_summary_calls). TensorFlow 1.5.1 summed the gradients'
clipping norm in float32 vector lanes, up to 2e-4 low, which at learning
rate 1.0 parts the two runs within an epoch (docs/original.md); the port
sums it the same way on this machine's cores (--original_norm_threads)
unless given --nooriginal_norm. The original's TensorFlow keeps the pages
it frees (--original_keep_pages), which spares it most of its page faults
and changes none of its arithmetic. With dropout off (keep_prob=1)
the two compute the same function and the same updates, so their lines
differ only by rounding, the order of float sums; with dropout on, their
random draws differ.
"""

import os
import signal
import sys
import tempfile

from absl import flags

from ptb import config as config_lib
from ptb import curves
from ptb import data as data_lib
from ptb import errors
from ptb import original_checkpoint
from ptb import original_run
from ptb import summary_thread
from ptb.errors import UserError
import ptb_word_lm  # its configs, and its flags --model, --data_path, --seed,
# --config_overrides, which this script reads as it reads them.
import reader

_HERE = os.path.dirname(os.path.abspath(__file__))
flags.DEFINE_string("original", None,
                    "Directory of the 2018 tutorial's ptb_word_lm.py, "
                    "reader.py and util.py.")
flags.DEFINE_string("original_venv",
                    os.path.join(data_lib.cache_root(), "venv-original"),
                    "The original's Python 3.6 virtualenv with TensorFlow "
                    "1.5.1; made here if missing.")
flags.DEFINE_integer("epochs", 0, "Epochs to train and compare.")
flags.DEFINE_float("fraction", 0.0,
                   "Instead of --epochs: compare the progress lines of epoch "
                   "1 up to this fraction of it.")
flags.DEFINE_bool("original_norm", True,
                  "The port sums its clipping norm as the original's "
                  "TensorFlow 1.5.1 did on this machine's cores "
                  "(--original_norm_threads); false: its own exact sum.")
flags.DEFINE_bool("original_keep_pages", True,
                  "The original's TensorFlow 1.5.1 keeps the pages it frees "
                  "(its jemalloc's lg_dirty_mult:-1): the same arithmetic, "
                  "without most of its page faults; false: as it shipped.")
FLAGS = flags.FLAGS

_SCRIPT = os.path.join(_HERE, "ptb_word_lm.py")
_FLAG_RANGES = {"epochs": (0, True), "fraction": (0, True, 1),
                "seed": (0, True, 2**31 - 1)}
# The port's flags this script reads; it refuses the others, which set
# what the original cannot run like for like.
_TAKEN = ("model", "data_path", "seed", "config_overrides")


def check_port_flags():
  """Refuses ptb_word_lm.py's flags that the comparison does not take."""
  for module in (ptb_word_lm, ptb_word_lm.extra_flags):
    for flag in FLAGS.get_flags_for_module(module.__name__):
      if flag.present and flag.name not in _TAKEN:
        raise UserError(
            "--%s: the comparison runs both programs as the original ran on "
            "the CPU (--num_gpus=0, BASIC, float32); it takes only --%s of "
            "ptb_word_lm.py's flags" % (flag.name, ", --".join(_TAKEN)),
            exit_code=2)


def port_config(model, overrides):
  """The port's config for `model` with `overrides`, refused if unlike.

  Raises:
    UserError: an override of max_max_epoch (--epochs sets it), or an
      rnn_mode the original cannot run on a CPU.
  """
  config = ptb_word_lm.get_config(model)
  if overrides:
    changed = config_lib.apply_overrides(config, overrides)
    if "max_max_epoch" in changed:
      raise UserError("--config_overrides: give the epochs as --epochs, not "
                      "max_max_epoch", exit_code=2)
    if changed.get("rnn_mode", config_lib.BASIC) not in (config_lib.BASIC,
                                                         config_lib.AUTO):
      raise UserError(
          "--config_overrides: rnn_mode=%s cannot be compared: the original "
          "forces BASIC unless --num_gpus=1, which needs a GPU"
          % changed["rnn_mode"], exit_code=2)
  config_lib.validate_config(config)
  return config


def original_fields(directory, model):
  """The fields of the original's config class for `model`, but rnn_mode."""
  classes = config_lib.configs_from_source(
      os.path.join(directory, original_run.FILES[0]), original_run.CLASSES)
  fields = config_lib.config_fields(classes[model]())
  fields.pop("rnn_mode", None)  # forced to BASIC on the CPU
  return fields


def edits(config, fields, epochs):
  """The original's fields that differ from the port's `config`."""
  values = dict(config_lib.config_fields(config), max_max_epoch=epochs)
  return {name: values[name] for name in fields
          if name in values and values[name] != fields[name]}


def epoch_calls(data_path, config):
  """Session calls of a training and of a validation pass (one window a
  call, as both programs make them here)."""
  train, valid, _, _ = reader.ptb_raw_data(data_path)
  return tuple((len(words) // config.batch_size - 1) // config.num_steps
               for words in (train, valid))


def table(original, port):
  """The comparison's rows: every line both printed, in the order printed."""
  def order(key):
    kind = key[0]
    if kind == "progress":
      return (0, float(key[1]))
    if kind in ("train", "valid"):
      return (1, key[1], kind == "valid")
    return (2,)
  rows = ["| line | original | port | port / original |", "|---|---|---|---|"]
  for key in sorted((k for k in original if k in port and k[0] != "speed"),
                    key=order):
    if key[0] == "progress":
      label = "epoch 1 at %s" % key[1]
    elif key[0] == "test":
      label = "test"
    else:
      label = "epoch %d %s" % (key[1], key[0])
    rows.append("| %s | %.3f | %.3f | %.5f |" % (
        label, original[key], port[key], port[key] / original[key]))
  return rows


def speed_line(original, port, seconds):
  """Both programs' speed at their last common progress line, and time."""
  common = sorted((k for k in original if k[0] == "speed" and k in port),
                  key=lambda k: float(k[1]))
  line = "wall time: original %.0f s, port %.0f s" % seconds
  if common:
    key = common[-1]
    line = ("speed at %s of epoch 1: original %.0f wps, port %.0f wps "
            "(%.2fx); %s" % (key[1], original[key], port[key],
                             port[key] / original[key], line))
  return line


def main(_):
  config_lib.check_absl_flags(FLAGS, _FLAG_RANGES)
  if bool(FLAGS.epochs > 0) == bool(FLAGS.fraction > 0):
    raise UserError("give one of --epochs=N (N >= 1) and --fraction=F "
                    "(0 < F <= 1)", exit_code=2)
  check_port_flags()
  original_run.check_files(FLAGS.original)
  config = port_config(FLAGS.model, FLAGS.config_overrides)
  epochs = FLAGS.epochs or 1
  values = edits(config, original_fields(FLAGS.original, FLAGS.model),
                 epochs)
  if (not os.path.exists(FLAGS.original_venv)
      and original_run.find_python36() is None):
    raise UserError("no virtualenv at --original_venv=%s, and no Python 3.6 "
                    "to make it with (TensorFlow 1.5.1 needs one): set "
                    "PYTHON36=/path/to/python3.6" % FLAGS.original_venv)
  data_path = data_lib.resolve(FLAGS.data_path)
  data_lib.corpus_files(data_path)
  python = original_run.ensure_venv(FLAGS.original_venv)
  seed = 1 if FLAGS.seed is None else FLAGS.seed
  with tempfile.TemporaryDirectory(prefix="compare_original_") as work:
    save_path = os.path.join(work, "original")
    # Each program gets its own copy: the original's Supervisor saves into
    # save_path every 10 minutes and, having restored from it, counts the
    # copy there among the 5 saves its Saver keeps, so a run of an hour
    # deletes it before the port starts.
    weights = original_checkpoint.initial_values(config, seed)
    original_checkpoint.write(os.path.join(save_path, "model.ckpt-0"),
                              weights)
    ckpt = original_checkpoint.write(
        os.path.join(work, "initial", "model.ckpt-0"), weights)
    diff = original_run.write_copy(FLAGS.original, os.path.join(work, "code"),
                                   FLAGS.model, values)
    print("The original's %s, edited in place:" %
          original_run.CLASSES[FLAGS.model])
    print(diff or "(unchanged)")
    env = original_run.environment(FLAGS.original_keep_pages, os.environ)
    print("The original runs with JEMALLOC_MALLOC_CONF=%s%s." % (
        env.get("JEMALLOC_MALLOC_CONF", "(unset)"),
        ": it keeps the pages it frees (--nooriginal_keep_pages: as it "
        "shipped)" if FLAGS.original_keep_pages else ""))
    line_times = {}
    original, original_seconds = curves.run("the original", original_run.command(
        python, os.path.join(work, "code"), data_path, FLAGS.model,
        save_path), FLAGS.fraction, env=env, echo=True, line_times=line_times,
        stop=signal.SIGINT)
    steps = summary_thread.takes_in_events(save_path)
    takes = summary_thread.calls_of_takes(
        steps, *epoch_calls(data_path, config), line_times)
    print("The original's summary thread took windows at its global steps "
          "%s; the port takes after its calls %s." % (
              ",".join(str(s) for s, _ in steps), ",".join(map(str, takes))))
    overrides = ",".join(filter(None, [FLAGS.config_overrides,
                                       "max_max_epoch=%d" % epochs]))
    threads = len(os.sched_getaffinity(0)) if FLAGS.original_norm else 0
    print("The port sums its clipping norm %s." % (
        "as TensorFlow 1.5.1 did on %d cores (--original_norm_threads=%d)"
        % (threads, threads) if threads else "exactly (--nooriginal_norm)"))
    port, port_seconds = curves.run("ptb_word_lm.py", [
        sys.executable, _SCRIPT, "--data_path=" + data_path,
        "--model=" + FLAGS.model, "--num_gpus=0", "--rnn_mode=BASIC",
        "--train_from_zero_state", "--seed=%d" % seed, "--init_from=" + ckpt,
        "--original_summary_calls=" + ",".join(map(str, takes)),
        "--original_norm_threads=%d" % threads, "--eval_unroll=1",
        "--config_overrides=" + overrides], FLAGS.fraction, echo=True)
  print("%s, %s, from the same weights (seed %d):" % (
      FLAGS.model, "%d epochs" % epochs if FLAGS.epochs else
      "first %.2f of epoch 1" % FLAGS.fraction, seed))
  print("\n".join(table(original, port)))
  print(speed_line(original, port, (original_seconds, port_seconds)))


if __name__ == "__main__":
  errors.catch_signals()
  errors.run_main(main, graph_mode=False)
