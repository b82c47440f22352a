"""Training-speed benchmark of the PTB LSTM, against the machine's own limit.

Builds the very training graph ptb_word_lm.py trains (same functions), runs
warm-up steps and timed steps on the real data, and prints per combination
of --model and --rnn_mode: words per second, the analytic training FLOPs per
word, the achieved GFLOP/s, the float32 matrix-multiply ceiling TensorFlow
reaches in this process (the better of two measurements, just before and
just after the combination's steps), their ratio (model FLOP utilisation),
the CPU's float32 FMA peak measured in-process in the kernels' vector width
(isa=avx512 or avx2; likewise before and after) and the model's GFLOP/s as
a fraction of it, peak RSS, the plan that the training step was built
from (ptb/plan.py: the kernels' width, each layer's path, the recurrent
products, the softmax loss, the updates and the swapped products), whether
TensorFlow's matmuls ran on oneDNN (matmul=onednn) or on Eigen
(matmul=eigen; ptb/onednn.py), and the roofline: the memory bandwidth
measured in-process (a triad on the session's threads, arrays far larger
than the last-level cache; after the combination's steps), the bytes a
training step must move at the least (train_bytes_per_word), the GB/s that
makes at the run's speed as a fraction of the bandwidth, the words per
second that each roof allows (compute: the FMA peak over the FLOPs;
bandwidth: the bandwidth over the bytes) and the lower of the two, which
is the bound the config is under, with the run's fraction of it
(ptb/roofline.py).

  python benchmark.py --data_path=DIR --model=small,medium --rnn_mode=BASIC,BLOCK \\
      --num_gpus=0 --steps=60 --warmup=5

With --use_bf16 the products run in bfloat16 (ptb/bfloat16.py): the line
adds the CPU's bfloat16 peak (bf16_peak_gflops, the kernels' Bf16Peak on
AVX512_BF16 or AMX; unknown on a CPU without either, whose converted
products run on the FMA units), and the fraction and the compute roof are
of the peak that bounds the products (FmaPeak's where the plan keeps
every product in float32).

The last line printed is `wps: N` for the last combination. With
--roofline=FILE.png it also draws the machine's roofline with this call's
results on it; with --roofline_from=A.json,B.json as well, it measures
nothing and draws the results of those --output_json files instead (a
float32 run's and a bfloat16 run's, say).
"""

import sys
import time

from ptb import errors
from ptb import monitor
from ptb import onednn
from ptb import startup_log
if __name__ == "__main__":
  errors.catch_signals()  # Ctrl-C from here on ends in one line
  # Before TensorFlow is imported: no Keras, two malloc arenas, oneDNN.
  monitor.reduce_memory_footprint()
  onednn.enable()
  startup_log.import_tensorflow()  # its C++ start-up lines held to the level

from absl import flags  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from ptb import bfloat16
from ptb import config as config_lib
from ptb import data as data_lib
from ptb import devices as devices_lib
from ptb import kernel_offer
from ptb import machine
from ptb import outputs
from ptb import plan as plan_lib
from ptb import planner
from ptb import profile as profile_lib
from ptb import roofline as roofline_lib
from ptb.errors import UserError
import ptb_word_lm
import reader

flags.DEFINE_integer("steps", 60, "Timed training steps per combination.")
flags.DEFINE_integer("warmup", 5, "Untimed training steps first.")
flags.DEFINE_string("output_json", None, "Also write the figures here.")
flags.DEFINE_string(
    "profile", None,
    "After the timed steps, trace three and print each part's share of "
    "their mean (ptb/profile.py); --profile alone prints, "
    "--profile=FILE.png also draws the last combination's.")
flags.DEFINE_string("roofline", None, "Draw the machine's roofline with the "
                    "results on it in this file (.png, .pdf or .svg); needs "
                    "matplotlib (requirements-plot.txt).")
flags.DEFINE_string("roofline_from", None, "Comma-separated --output_json "
                    "files of earlier calls: measure nothing, and draw their "
                    "results into --roofline instead.")

FLAGS = flags.FLAGS
# The ranges of this script's own numeric flags (see config.FLAG_RANGES).
_FLAG_RANGES = {"steps": (1, True), "warmup": (0, True)}


def measure(model_name, rnn_mode, train_data, devices, session_config):
  """Times training steps of one model/rnn_mode; returns (figures, config)."""
  config = config_lib.resolve_config(
      ptb_word_lm.get_config(model_name, rnn_mode), FLAGS.num_gpus,
      FLAGS.config_overrides)
  devices_lib.check_devices(FLAGS.num_gpus, config.rnn_mode, FLAGS.cpu_towers)
  # What the training step runs (figures of machines compare only like
  # with like): the plan it is built from.
  products = bfloat16.products(FLAGS.use_bf16)
  plan = planner.make(FLAGS.plan, config, devices,
                      ptb_word_lm.data_type(FLAGS.use_fp16), plan_lib.offered(),
                      products=products)
  print(plan_lib.line(plan), file=sys.stderr, flush=True)
  with tf.Graph().as_default():
    if FLAGS.seed is not None:
      tf.compat.v1.set_random_seed(FLAGS.seed)
    model = ptb_word_lm.build_model("Train", True, config, train_data, devices,
                                    FLAGS.use_fp16, plan=plan.train)
    with tf.compat.v1.Session(config=session_config) as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer()])
      model.assign_lr(session, config.learning_rate)
      fetches = [model.cost, model.train_op, model.update_state]
      # As ptb_word_lm.py does, so that the peak RSS is the same figure.
      monitor.release_library_pages()
      # The peak over the training steps, warm-up and timed, as
      # torch_peer.py measures it.
      monitor.reset_peak_rss()
      for i in range(FLAGS.warmup):
        session.run(fetches)
        if i == 0:
          monitor.release_library_pages()
      faults = monitor.page_faults()
      start = time.perf_counter()
      for _ in range(FLAGS.steps):
        cost = session.run(fetches)[0]
      elapsed = time.perf_counter() - start
      faults = monitor.page_faults() - faults
      parts = profile_step(session, fetches, config) if FLAGS.profile else {}
  words = FLAGS.steps * config.batch_size * config.num_steps * len(devices)
  wps = words / elapsed
  flops = roofline_lib.train_flops_per_word(config)
  fields = dict(plan_lib.fields(plan))
  # The peak that bounds the step is its plan's: with --use_bf16 the planner
  # keeps every product in float32 where bfloat16 is no faster.
  if fields["products"] == bfloat16.FLOAT32:
    products = bfloat16.FLOAT32
  return {"model": model_name, "config_overrides": FLAGS.config_overrides,
          "rnn_mode": config.rnn_mode.upper(),
          "wps": wps, "seconds": elapsed, "steps": FLAGS.steps,
          "page_faults_per_step": faults / FLAGS.steps,
          "last_cost": float(cost), "train_flops_per_word": flops,
          "gflops": wps * flops / 1e9, "products": products,
          "plan": fields, "plan_why": plan.why,
          "matmul": onednn.matmul_library(), **parts}, config


def profile_step(session, fetches, config, calls=3):
  """The parts of a training step (ptb/profile.py), for the result.

  The mean of `calls` traced steps: which ops overlap differs from step to
  step, and one step's shares move by several points with it.
  """
  dims = {"batch": config.batch_size, "hidden": config.hidden_size,
          "vocab": config.vocab_size}
  seconds = dict.fromkeys(profile_lib.PARTS, 0.0)
  busy = step = 0.0
  for _ in range(calls):
    spans = profile_lib.intervals(
        session.graph, profile_lib.trace(session, fetches), dims)
    parts, call_busy, call_step = profile_lib.shares(spans)
    for k in parts:
      seconds[k] += parts[k] / calls
    busy += call_busy / calls
    step += call_step / calls
  return {"profile_seconds": seconds, "profile_busy_seconds": busy,
          "profile_step_seconds": step}


def _peak_text(r):
  """The result line's peak fields: unknown ones say so.

  fma_peak_gflops, then with bfloat16 products bf16_peak_gflops; the
  peak_fraction is of the peak that bounds the products (compute_peak).
  """
  def figure(key, form):
    return "%s=%s" % (key, "unknown" if r[key] is None else form % r[key])
  fields = [figure("fma_peak_gflops", "%.1f")]
  if r["products"] == bfloat16.BFLOAT16:
    fields.append(figure("bf16_peak_gflops", "%.1f"))
  fields += [figure("peak_fraction", "%.3f"),
             "isa=%s" % (r["kernel_isa"] if r["fma_peak_gflops"] else "none")]
  return " ".join(fields)


def compute_peak(products, fma, bf16):
  """The peak that bounds products of dtype `products`, None if unknown.

  bfloat16 products run on the bfloat16 unit where the CPU has one, else
  (--force_bf16) on the float32 FMA units, converted.
  """
  if products == bfloat16.BFLOAT16 and bf16 is not None:
    return bf16
  return fma


def _roofline_text(r):
  """The result line's roofline fields; unknown ones say so."""
  def figure(key, form):
    return "%s=%s" % (key, "unknown" if r[key] is None else form % r[key])
  return " ".join([
      figure("bandwidth_gbs", "%.1f"),
      "train_bytes_per_word=%.4g" % r["train_bytes_per_word"],
      "gbs=%.1f" % r["gbs"], figure("bandwidth_fraction", "%.3f"),
      figure("compute_roof_wps", "%.0f"), figure("bandwidth_roof_wps", "%.0f"),
      figure("bound", "%s"), figure("roof_fraction", "%.3f")])


def _limits(session_config, bandwidth=True, bf16=False):
  """(matmul ceiling, FMA peak, bfloat16 peak, bandwidth) measured now.

  None where unknown. The bandwidth comes first, so that compute separates
  it from a model measured next; without `bandwidth`, it is None; the
  bfloat16 peak is measured only with `bf16` (--use_bf16).
  """
  gbs = machine.memory_bandwidth(session_config) if bandwidth else None
  return (machine.matmul_ceiling(session_config),
          machine.fma_peak(session_config),
          machine.bf16_peak(session_config) if bf16 else None, gbs)


def _better(x, y):
  """The larger of two measurements, either of which may be None."""
  known = [v for v in (x, y) if v is not None]
  return max(known) if known else None


def _names(flag):
  """The comma-separated names of the list flag `flag`; one at the least."""
  names = [n.strip() for n in FLAGS[flag].value.split(",") if n.strip()]
  if not names:
    raise UserError("--%s=%s names nothing; give one name or more, "
                    "separated by commas" % (flag, FLAGS[flag].value),
                    exit_code=2)
  return names


def check_combinations(models, modes, devices, train_data, words):
  """Refuses, before any measurement, a combination that cannot train.

  Each model with each mode is resolved as measure() resolves it, quietly,
  and checked against the devices and the training data; without this, a
  bad combination ends the run after the ones before it were measured.

  Args:
    models, modes: the --model and --rnn_mode names (a mode may be None).
    devices: the tower devices.
    train_data: the training word ids.
    words: the corpus's vocabulary size.
  """
  for model_name in models:
    for mode in modes:
      config = config_lib.resolve_config(
          ptb_word_lm.get_config(model_name, mode), FLAGS.num_gpus,
          FLAGS.config_overrides, announce=False)
      devices_lib.check_devices(FLAGS.num_gpus, config.rnn_mode,
                                FLAGS.cpu_towers)
      bfloat16.check(FLAGS.use_bf16, FLAGS.use_fp16, FLAGS.force_bf16,
                     devices, config.rnn_mode)
      reader.check_vocab_size(words, config.vocab_size)
      reader.check_epoch_size(len(train_data),
                              config.batch_size * len(devices),
                              config.num_steps, "ptb.train.txt")


def write_report(path, report):
  """Writes --output_json; a failed write is one error line, not a trace."""
  try:
    monitor.write_json_atomic(path, report)
  except OSError as e:
    raise UserError("--output_json=%s cannot be written: %s" % (
        path, errors.write_failure(e))) from None


def check_roofline_flags():
  """Checks --roofline and --roofline_from; returns the files' results.

  Returns:
    The results of the --roofline_from files to draw (ptb/roofline.py's
    load_results), or None where this call measures.

  Raises:
    UserError: --roofline_from without --roofline or with --output_json,
      a picture that cannot be drawn or written, or an input file that
      cannot be read or is not benchmark.py's.
  """
  if FLAGS.roofline_from is not None:
    if not FLAGS.roofline:
      raise UserError("--roofline_from draws into --roofline=FILE.png, "
                      "which is not given", exit_code=2)
    if FLAGS.output_json:
      raise UserError("--roofline_from measures nothing: --output_json "
                      "would be left unwritten", exit_code=2)
  if FLAGS.roofline:
    roofline_lib.check_output("roofline", FLAGS.roofline)
  if FLAGS.roofline_from is None:
    return None
  return roofline_lib.load_results(_names("roofline_from"))


def main(_):
  # Every flag, path and combination is checked before the first
  # measurement: a mistake costs seconds, not the combinations before it.
  config_lib.check_absl_flags(FLAGS, dict(config_lib.FLAG_RANGES,
                                          **_FLAG_RANGES))
  if FLAGS.output_json:
    outputs.check_file("output_json", FLAGS.output_json)
  if FLAGS.profile and FLAGS.profile != "text":
    if not FLAGS.profile.endswith(".png"):
      raise UserError("--profile=%s: give --profile alone, or a picture's "
                      "name ending in .png" % FLAGS.profile, exit_code=2)
    outputs.check_file("profile", FLAGS.profile)
  outputs.check_distinct(
      {f: FLAGS[f].value for f in ("output_json", "roofline", "profile")
       if FLAGS[f].value and FLAGS[f].value != "text"},
      inputs=[("roofline_from", p) for p in (_names("roofline_from")
                                             if FLAGS.roofline_from else [])])
  drawn = check_roofline_flags()
  if drawn is not None:
    roofline_lib.draw(drawn, FLAGS.roofline)
    return
  models = _names("model")
  modes = _names("rnn_mode") if FLAGS.rnn_mode else [None]
  devices = devices_lib.check_devices(
      FLAGS.num_gpus, config_lib.parse_rnn_mode(modes[0] or "basic"),
      FLAGS.cpu_towers)
  session_config = devices_lib.session_config(
      devices, FLAGS.intra_op_threads, FLAGS.inter_op_threads)
  train_data, _, _, words = reader.ptb_raw_data(
      data_lib.resolve(FLAGS.data_path))
  check_combinations(models, modes, devices, train_data, words)
  # The ceiling is measured before and after each combination, and the
  # higher of the two counts: the machine's speed drifts from minute to
  # minute, and a ceiling taken once, in a slow minute, made a large run's
  # utilisation 1.16. The FMA peak likewise, and the bandwidth after each
  # combination only: a model measured just after the triad trained a few
  # per cent slower (None where unknown).
  limits = _limits(session_config, bandwidth=False, bf16=FLAGS.use_bf16)
  results = []
  for model_name in models:
    for mode in modes:
      # The bandwidth's arrays must not count in the model's peak RSS.
      monitor.reset_peak_rss()
      r, config = measure(model_name, mode, train_data, devices,
                          session_config)
      r["peak_rss_mib"] = monitor.peak_rss_mib()
      after = _limits(session_config, bf16=FLAGS.use_bf16)
      ceiling, fma, bf16, bandwidth = (_better(x, y)
                                       for x, y in zip(limits, after))
      peak = compute_peak(r["products"], fma, bf16)
      r.update(ceiling_gflops=ceiling,
               ceiling_trials_gflops=[limits[0], after[0]],
               mfu=r["gflops"] / ceiling, fma_peak_gflops=fma,
               bf16_peak_gflops=bf16,
               peak_fraction=r["gflops"] / peak if peak else None,
               kernel_isa=kernel_offer.kernel_width()[0])
      r.update(roofline_lib.roofline(r, config, peak, bandwidth,
                                     r["products"]))
      limits = after
      results.append(r)
      print("model=%(model)s rnn_mode=%(rnn_mode)s wps=%(wps).0f "
            "train_flops_per_word=%(train_flops_per_word).4g "
            "gflops=%(gflops).1f ceiling_gflops=%(ceiling_gflops).1f "
            "mfu=%(mfu).3f %(peak)s %(roofline)s "
            "peak_rss_mib=%(peak_rss_mib).0f "
            "page_faults_per_step=%(page_faults_per_step).0f "
            "%(plan)s matmul=%(matmul)s" %
            dict(r, peak=_peak_text(r), roofline=_roofline_text(r),
                 plan=" ".join("%s=%s" % kv for kv in r["plan"].items())),
            flush=True)
      if FLAGS.profile:
        print("%s; the timed steps took %.3f s each" % (profile_lib.line(
            r["profile_seconds"], r["profile_busy_seconds"],
            r["profile_step_seconds"]), r["seconds"] / r["steps"]),
              flush=True)
  report = {"tensorflow": tf.__version__, "cpu": roofline_lib.cpu_model(),
            "devices": devices, "intra_op_threads": FLAGS.intra_op_threads,
            "inter_op_threads": FLAGS.inter_op_threads, "results": results}
  if FLAGS.output_json:
    write_report(FLAGS.output_json, report)
  if FLAGS.profile and FLAGS.profile.endswith(".png"):
    last = results[-1]
    profile_lib.draw(last["profile_seconds"], last["profile_step_seconds"],
                     "%s, %s, %s products (%s)" % (
                         last["model"], last["rnn_mode"], last["products"],
                         report["cpu"]), FLAGS.profile)
  if FLAGS.roofline:
    # Each result with the report's CPU and TensorFlow, for the title, as
    # roofline_lib.load_results gives a file's.
    roofline_lib.draw([dict(r, cpu=report["cpu"], tensorflow=tf.__version__)
                       for r in results], FLAGS.roofline)
  print("wps: %.0f" % results[-1]["wps"])


if __name__ == "__main__":
  # --profile alone prints the profile; absl's string flags want a value.
  sys.argv = ["--profile=text" if a == "--profile" else a for a in sys.argv]
  errors.run_main(main)
