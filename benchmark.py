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

The last line printed is `wps: N` for the last combination. With
--roofline=FILE.png it also draws the machine's roofline with this call's
results on it; with --roofline_from=A.json,B.json as well, it measures
nothing and draws the results of those --output_json files instead (a
float32 run's and a bfloat16 run's, say).
"""

import os
import time

from ptb import monitor
from ptb import onednn
from ptb import startup_log
if __name__ == "__main__":
  # Before TensorFlow is imported: no Keras, two malloc arenas, oneDNN.
  monitor.reduce_memory_footprint()
  onednn.enable()
  startup_log.import_tensorflow()  # its C++ start-up lines held to the level

from absl import flags  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from ptb import config as config_lib
from ptb import data as data_lib
from ptb import devices as devices_lib
from ptb import errors
from ptb import kernels
from ptb import outputs
from ptb import plan as plan_lib
from ptb import roofline as roofline_lib
from ptb.errors import UserError
import ptb_word_lm
import reader

flags.DEFINE_integer("steps", 60, "Timed training steps per combination.")
flags.DEFINE_integer("warmup", 5, "Untimed training steps first.")
flags.DEFINE_string("output_json", None, "Also write the figures here.")
flags.DEFINE_string("roofline", None, "Draw the machine's roofline with the "
                    "results on it in this file (.png, .pdf or .svg); needs "
                    "matplotlib (requirements-plot.txt).")
flags.DEFINE_string("roofline_from", None, "Comma-separated --output_json "
                    "files of earlier calls: measure nothing, and draw their "
                    "results into --roofline instead.")

FLAGS = flags.FLAGS
# The ranges of this script's own numeric flags (see config.FLAG_RANGES).
_FLAG_RANGES = {"steps": (1, True), "warmup": (0, True)}


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
  if plan_lib.kernel_width()[0] is None or not kernels.compiler_found():
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
  with tf.Graph().as_default():
    iterations = tf.compat.v1.placeholder(tf.int64, [])
    flops, checksum = library.fma_peak(iterations)
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


def measure(model_name, rnn_mode, train_data, devices, session_config):
  """Times training steps of one model/rnn_mode; returns (figures, config)."""
  config = config_lib.resolve_config(
      ptb_word_lm.get_config(model_name, rnn_mode), FLAGS.num_gpus,
      FLAGS.config_overrides)
  devices_lib.check_devices(FLAGS.num_gpus, config.rnn_mode, FLAGS.cpu_towers)
  # What the training step runs (figures of machines compare only like
  # with like): the plan it is built from.
  plan = plan_lib.make(config, devices, ptb_word_lm.data_type(FLAGS.use_fp16),
                       plan_lib.offered())
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
  words = FLAGS.steps * config.batch_size * config.num_steps * len(devices)
  wps = words / elapsed
  flops = roofline_lib.train_flops_per_word(config)
  return {"model": model_name, "rnn_mode": config.rnn_mode.upper(),
          "wps": wps, "seconds": elapsed, "steps": FLAGS.steps,
          "page_faults_per_step": faults / FLAGS.steps,
          "last_cost": float(cost), "train_flops_per_word": flops,
          "gflops": wps * flops / 1e9, "products": roofline_lib.FLOAT32,
          "plan": dict(plan_lib.fields(plan)),
          "matmul": onednn.matmul_library()}, config


def _peak_text(r):
  """The result line's FMA-peak fields: unknown ones say so."""
  if r["fma_peak_gflops"] is None:
    return "fma_peak_gflops=unknown peak_fraction=unknown isa=none"
  return ("fma_peak_gflops=%(fma_peak_gflops).1f "
          "peak_fraction=%(peak_fraction).3f isa=%(kernel_isa)s" % r)


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


def _limits(session_config, bandwidth=True):
  """(matmul ceiling, FMA peak, bandwidth) measured now; None where unknown.

  The bandwidth comes first, so that compute separates it from a model
  measured next; without `bandwidth`, it is None.
  """
  gbs = memory_bandwidth(session_config) if bandwidth else None
  return matmul_ceiling(session_config), fma_peak(session_config), gbs


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
  limits = _limits(session_config, bandwidth=False)
  results = []
  for model_name in models:
    for mode in modes:
      # The bandwidth's arrays must not count in the model's peak RSS.
      monitor.reset_peak_rss()
      r, config = measure(model_name, mode, train_data, devices,
                          session_config)
      r["peak_rss_mib"] = monitor.peak_rss_mib()
      after = _limits(session_config)
      ceiling, peak, bandwidth = (_better(x, y)
                                  for x, y in zip(limits, after))
      r.update(ceiling_gflops=ceiling,
               ceiling_trials_gflops=[limits[0], after[0]],
               mfu=r["gflops"] / ceiling, fma_peak_gflops=peak,
               peak_fraction=r["gflops"] / peak if peak else None,
               kernel_isa=plan_lib.kernel_width()[0])
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
  report = {"tensorflow": tf.__version__, "cpu": roofline_lib.cpu_model(),
            "devices": devices, "intra_op_threads": FLAGS.intra_op_threads,
            "inter_op_threads": FLAGS.inter_op_threads, "results": results}
  if FLAGS.output_json:
    write_report(FLAGS.output_json, report)
  if FLAGS.roofline:
    # Each result with the report's CPU and TensorFlow, for the title, as
    # roofline_lib.load_results gives a file's.
    roofline_lib.draw([dict(r, cpu=report["cpu"], tensorflow=tf.__version__)
                       for r in results], FLAGS.roofline)
  print("wps: %.0f" % results[-1]["wps"])


if __name__ == "__main__":
  errors.run_main(main)
