"""Tests of benchmark.py."""

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import flagsaver
import tensorflow as tf

from ptb import bfloat16
from ptb import errors
from ptb import kernel_offer
from ptb import kernels
from ptb import machine
from ptb import profile as profile_lib
from ptb import roofline
from ptb import testing
import benchmark
import ptb_word_lm_testing
from ptb_word_lm_testing import run_in_process


def _kernels_buildable():
  """Whether a benchmark.py process can build and use lstm_kernels here."""
  return kernel_offer.kernel_width()[0] is not None and kernels.compiler_found()


def _softmax_path():
  """What benchmark.py should report for a float32 model on this CPU."""
  return "kernel" if _kernels_buildable() else "ops"


def _peak_fields():
  """The FMA-peak fields benchmark.py should print here, as a regex."""
  if not _kernels_buildable():
    return "fma_peak_gflops=unknown peak_fraction=unknown isa=none"
  return (r"fma_peak_gflops=\S+ peak_fraction=\S+ isa=%s"
          % kernel_offer.kernel_width()[0])


def _roofline_fields():
  """The roofline fields benchmark.py should print here, as a regex."""
  measured = _kernels_buildable()
  known = lambda pattern: pattern if measured else "unknown"
  return (r"bandwidth_gbs=%s train_bytes_per_word=\S+ gbs=\S+ "
          r"bandwidth_fraction=%s compute_roof_wps=%s bandwidth_roof_wps=%s "
          r"bound=%s roof_fraction=%s" % (
              known(r"\S+"), known(r"\S+"), known(r"\d+"), known(r"\d+"),
              known("(compute|bandwidth)"), known(r"\S+")))


def run_benchmark(args):
  """Runs benchmark.main with the command line `args` in this process.

  The machine's limits are measured as the program measures them, in short
  trials on small arrays: the figures are checked for how they combine,
  not for their size.

  Returns:
    stdout.
  """
  argv = ["benchmark.py"] + list(args)
  out = io.StringIO()
  with contextlib.ExitStack() as stack:
    stack.enter_context(flagsaver.flagsaver())
    stack.enter_context(mock.patch.object(sys, "argv", argv))
    for name, short in (("matmul_ceiling", dict(size=512, seconds=0.05,
                                                trials=2)),
                        ("memory_bandwidth", dict(array_bytes=8 << 20,
                                                  trials=1)),
                        ("fma_peak", dict(seconds=0.01, trials=2)),
                        ("bf16_peak", dict(seconds=0.01, trials=2))):
      stack.enter_context(mock.patch.object(
          machine, name, functools.partial(getattr(machine, name),
                                           **short)))
    stack.enter_context(contextlib.redirect_stdout(out))
    benchmark.FLAGS(argv)
    benchmark.main(argv)
  return out.getvalue()


class InProcessBenchmarkTest(tf.test.TestCase):
  """One run of benchmark.main in this process, two combinations.

  Hidden 512, batch 10 and 8 steps: where the model starts to use the
  kernels' recurrent products. The run writes its JSON and draws its
  roofline; a test draws that JSON again with --roofline_from.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tmp = tempfile.TemporaryDirectory()
    cls.addClassCleanup(tmp.cleanup)
    cls.tmp = tmp.name
    testing.make_corpus(cls.tmp)
    cls.out_json = os.path.join(cls.tmp, "bench.json")
    # This call's results drawn after them, too.
    cls.measured_png = os.path.join(cls.tmp, "measured.png")
    cls.out = run_benchmark([
        "--data_path=" + cls.tmp, "--model=test", "--rnn_mode=BASIC,block",
        "--num_gpus=0", "--steps=3", "--warmup=1",
        "--output_json=" + cls.out_json, "--roofline=" + cls.measured_png,
        "--config_overrides=vocab_size=100,hidden_size=512,batch_size=10,"
        "num_steps=8", "--plan=estimate"])  # the rules' plan, reported
    with open(cls.out_json) as f:
      cls.report = json.load(f)

  def testEveryCombinationAndJson(self):
    lines = self.out.splitlines()
    rows = [l for l in lines if l.startswith("model=")]
    self.assertLen(rows, 2)
    for row, mode, r in zip(rows, ("BASIC", "BLOCK"),
                            self.report["results"]):
      # The plan's fields, whichever ptb/plan.py has, as in the JSON.
      self.assertEqual(r["plan"]["softmax"], _softmax_path())
      plan = " ".join("%s=%s" % kv for kv in r["plan"].items())
      self.assertRegex(row, r"^model=test rnn_mode=%s wps=\d+ "
                       r"train_flops_per_word=\S+ gflops=\S+ "
                       r"ceiling_gflops=\S+ mfu=\S+ %s %s peak_rss_mib=\d+ "
                       r"page_faults_per_step=\d+ %s matmul=onednn$"
                       % (mode, _peak_fields(), _roofline_fields(),
                          re.escape(plan)))
    self.assertRegex(lines[-1], r"^wps: \d+$")
    results = self.report["results"]
    self.assertEqual([r["rnn_mode"] for r in results], ["BASIC", "BLOCK"])
    self.assertEqual(lines[-1], "wps: %.0f" % results[-1]["wps"])
    # Each combination's ceiling is the better of the measurements just
    # before and just after it; the one after is the next one's before.
    self.assertEqual(results[1]["ceiling_trials_gflops"][0],
                     results[0]["ceiling_trials_gflops"][1])
    for r in results:
      self.assertEqual(r["steps"], 3)
      self.assertGreater(r["ceiling_gflops"], 1)
      self.assertEqual(r["ceiling_gflops"], max(r["ceiling_trials_gflops"]))
      self.assertAllClose(r["mfu"], r["gflops"] / r["ceiling_gflops"])
      self.assertAllClose(r["gflops"],
                          r["wps"] * r["train_flops_per_word"] / 1e9)
      if _kernels_buildable():
        self.assertEqual(r["kernel_isa"], kernel_offer.kernel_width()[0])
        self.assertGreater(r["fma_peak_gflops"], 1)
        self.assertAllClose(r["peak_fraction"],
                            r["gflops"] / r["fma_peak_gflops"])
        self.assertGreater(r["bandwidth_gbs"], 0.5)
        roofs = {"compute": r["compute_roof_wps"],
                 "bandwidth": r["bandwidth_roof_wps"]}
        self.assertEqual(r["bound"], min(roofs, key=roofs.get))
        self.assertAllClose(r["roof_fraction"], r["wps"] / min(roofs.values()))
      else:
        self.assertIsNone(r["fma_peak_gflops"])
        self.assertIsNone(r["peak_fraction"])
        self.assertIsNone(r["bandwidth_gbs"])

  def testDrawsTheRooflineOfItsJson(self):
    png = os.path.join(self.tmp, "drawn", "roofline.png")
    with mock.patch.object(benchmark, "measure") as measure, \
        mock.patch.object(benchmark, "_limits") as limits:
      out = run_benchmark(["--roofline_from=" + self.out_json,
                           "--roofline=" + png])
    self.assertFalse(measure.called or limits.called, "measured")
    self.assertEqual(out, "")
    for path in (png, self.measured_png):
      with open(path, "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    results = self.report["results"]
    self.assertEqual([r["products"] for r in results], ["float32"] * 2)
    ax = roofline.figure(roofline.load_results([self.out_json])).axes[0]
    self.assertEqual((ax.get_xscale(), ax.get_yscale()), ("log", "log"))
    self.assertIn("FLOPs per byte", ax.get_xlabel())
    self.assertEqual(ax.get_ylabel(), "GFLOP/s")
    self.assertIn("TensorFlow %s" % tf.__version__, ax.get_title())
    points = [l for l in ax.get_lines() if l.get_gid() == "result"]
    # Labelled with the run's config overrides, which the JSON records.
    named = "test (%s) float32" % results[0]["config_overrides"]
    self.assertEqual([p.get_label() for p in points],
                     [named + " BASIC", named + " BLOCK"])
    for point, r in zip(points, results):
      self.assertEqual(point.get_xydata().tolist(), [[
          r["train_flops_per_word"] / r["train_bytes_per_word"],
          r["gflops"]]])
    (ceiling,) = [l for l in ax.get_lines() if l.get_gid() == "ceiling_gflops"]
    self.assertEqual(ceiling.get_ydata()[0],
                     max(r["ceiling_gflops"] for r in results))
    if _kernels_buildable():
      (peak,) = [l for l in ax.get_lines()
                 if l.get_gid() == "fma_peak_gflops"]
      self.assertEqual(peak.get_ydata()[0],
                       max(r["fma_peak_gflops"] for r in results))

  def testReportsThePlanOfTheTrainingStep(self):
    # Hidden 512, batch 10, 8 steps: the recurrent kernels where they run.
    want = "kernels" if _kernels_buildable() else "matmul"
    rows = [l for l in self.out.splitlines() if l.startswith("model=")]
    self.assertLen(rows, 2)
    for row, r in zip(rows, self.report["results"]):
      self.assertIn(" recurrent=%s " % want, row)
      self.assertEqual(r["plan"]["recurrent"], want)
      self.assertEqual((r["plan"]["plan"], r["plan_why"]),
                       ("estimate", "the rules of ptb/plan.py"))
      self.assertIn(" ".join("%s=%s" % kv for kv in r["plan"].items()), row)


class CommandLineTest(tf.test.TestCase):
  """benchmark.py as a program: one short run, its real measurements."""

  def testPrintsItsLineAndWpsAndKeepsKerasOut(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      out_json = os.path.join(tmp, "bench.json")
      proc = subprocess.run(
          [sys.executable, "-X", "importtime",
           os.path.join(testing.HERE, "benchmark.py"), "--data_path=" + tmp,
           "--model=test", "--rnn_mode=block", "--num_gpus=0", "--steps=1",
           "--warmup=1", "--config_overrides=vocab_size=100",
           "--output_json=" + out_json],
          capture_output=True, text=True, timeout=600,
          # benchmark.py turns oneDNN on by itself (ptb/onednn.py).
          env={k: v for k, v in os.environ.items()
               if k != "TF_ENABLE_ONEDNN_OPTS"})
      self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
      with open(out_json) as f:
        (result,) = json.load(f)["results"]
    lines = proc.stdout.splitlines()
    self.assertLen(lines, 3)
    self.assertEqual(lines[0], "Config overrides: vocab_size=100")
    self.assertRegex(lines[1], r"^model=test rnn_mode=BLOCK wps=\d+ .* "
                     r"matmul=onednn$")
    self.assertEqual(lines[2], "wps: %.0f" % result["wps"])
    self.assertGreater(result["wps"], 0)
    # -X importtime lists every module the process imports on stderr:
    # TensorFlow, and no Keras (monitor.reduce_memory_footprint).
    imported = [line.rsplit("|", 1)[-1].strip()
                for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    self.assertIn("tensorflow", imported)
    self.assertEqual([m for m in imported if m.split(".")[0] == "keras"], [])


class RefusedCommandLineTest(ptb_word_lm_testing.SavePathTest):
  """Bad flags and inputs end in one line before anything is measured."""

  def setUp(self):
    super().setUp()
    self.data = testing.make_corpus(self.tmp)

  def _run(self, args):
    """benchmark.py's entry point on `args` after a valid command line.

    Its measurements are replaced by ones that fail the test if called.
    """
    argv = ["benchmark.py", "--data_path=" + self.data, "--model=test",
            "--num_gpus=0", "--config_overrides=vocab_size=100"] + args
    with mock.patch.object(benchmark, "measure") as measure, \
        mock.patch.object(benchmark, "_limits") as limits:
      result = testing.run_entry_point(
          functools.partial(errors.run_main, benchmark.main,
                            graph_mode=False), argv)
    self.assertFalse(measure.called or limits.called, "measured first")
    return result

  def testEachEndsInOneLineBeforeAnyMeasurement(self):
    gzipped = testing.make_gzipped_corpus(os.path.join(self.tmp, "gzipped"))
    a_file = os.path.join(self.data, "ptb.test.txt")
    png = os.path.join(self.tmp, "roofline.png")
    bad_json, no_results = (os.path.join(self.tmp, name)
                            for name in ("bad.json", "summary.json"))
    with open(bad_json, "w") as f:
      f.write("{\"results\": [")
    with open(no_results, "w") as f:
      json.dump({"epochs": []}, f)
    missing = os.path.join(self.tmp, "missing.json")
    testing.assert_each_refused(self, "benchmark.py", [
        (["--steps=0"], "--steps=0 must be at least 1", 2),
        (["--warmup=-1"], "--warmup=-1 must be 0 or more", 2),
        (["--cpu_towers=0"], "--cpu_towers=0 must be at least 1", 2),
        (["--seed=-1"], "--seed=-1 must be 0 or more", 2),
        (["--steps=many"], "flag --steps=many: invalid literal", 2),
        (["--no_such_flag=1"], "Unknown command line flag 'no_such_flag'", 2),
        # The second model or mode is refused before the first is measured.
        (["--model=test,huge"], "Invalid model: huge", 2),
        (["--model=,"], "--model=, names nothing", 2),
        (["--rnn_mode=basic,fast"], "Invalid --rnn_mode=fast", 2),
        (["--rnn_mode=basic,cudnn"], "--rnn_mode=CUDNN needs a GPU", 1),
        (["--config_overrides=num_layers=0"],
         "config num_layers=0 must be a positive integer", 2),
        (["--config_overrides=vocab_size=5"],
         "the training corpus has 31 distinct words but the config's "
         "vocab_size is 5", 1),
        (["--config_overrides=vocab_size=100,batch_size=1000"],
         "epoch_size == 0", 1),
        (["--data_path=" + os.path.join(self.tmp, "nowhere")],
         "does not exist", 1),
        (["--data_path=" + gzipped], "ptb.train.txt is not UTF-8 text", 1),
        (["--output_json=" + self.tmp], "is a directory; give a file name", 1),
        (["--profile=steps.txt"], "--profile=steps.txt: give --profile "
         "alone, or a picture's name ending in .png", 2),
        (["--profile=" + png, "--roofline=" + png], "name the same file", 2),
        (["--output_json=" + os.path.join(a_file, "out.json")],
         "cannot be written: Not a directory", 1),
        (["--roofline_from=" + no_results],
         "--roofline_from draws into --roofline=FILE.png, which is not "
         "given", 2),
        (["--roofline=" + png, "--roofline_from=" + missing],
         "--roofline_from=%s cannot be read: No such file or directory"
         % missing, 2),
        (["--roofline=" + png, "--roofline_from=" + bad_json],
         "--roofline_from=%s is not JSON" % bad_json, 2),
        (["--roofline=" + png, "--roofline_from=" + no_results],
         "is not benchmark.py's --output_json: it has no list of "
         "\"results\"", 2),
        (["--roofline=" + png, "--roofline_from=,"],
         "--roofline_from=, names nothing", 2),
        (["--roofline=" + png, "--roofline_from=" + no_results,
          "--output_json=" + os.path.join(self.tmp, "out.json")],
         "--roofline_from measures nothing", 2),
        (["--roofline=" + os.path.join(self.tmp, "roofline.txt")],
         "give a file name ending in .png", 2),
        (["--roofline=" + self.tmp], "is a directory; give a file name", 1),
        (["--use_bf16", "--force_bf16", "--use_fp16"],
         "--use_bf16 and --use_fp16 exclude each other", 2),
    ], self._run)
    self.assertFalse(os.path.exists(png))
    # One as a program: the real entry point, TensorFlow's set-up and all.
    testing.assert_error_line(
        self, "benchmark.py", testing.run_program(
            "benchmark.py", ["--data_path=" + self.data, "--steps=0"]),
        "--steps=0 must be at least 1", 2, alone=False)


  def testBfloat16OnACpuWithoutAUnitBeforeAnyMeasurement(self):
    cpuinfo = os.path.join(self.tmp, "cpuinfo")
    with open(cpuinfo, "w") as f:
      f.write("flags\t\t: avx2 fma\n")
    with mock.patch.object(bfloat16, "CPUINFO", cpuinfo):
      testing.assert_error_line(
          self, "benchmark.py", self._run(["--use_bf16"]),
          "this CPU has no bfloat16 unit (AVX512_BF16 or AMX)", 2)


class Bfloat16BenchmarkTest(tf.test.TestCase):
  """A --use_bf16 run (forced where the CPU has no bfloat16 unit)."""

  def testProductsAndTheirPeak(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      out_json = os.path.join(tmp, "bench.json")
      out = run_benchmark([
          "--data_path=" + tmp, "--model=test", "--num_gpus=0", "--steps=2",
          "--warmup=1", "--use_bf16", "--force_bf16",
          "--output_json=" + out_json, "--config_overrides=vocab_size=100"])
      with open(out_json) as f:
        r = json.load(f)["results"][0]
    self.assertEqual((r["products"], r["plan"]["products"]),
                     ("bfloat16", "bfloat16"))
    self.assertIn(" products=bfloat16 ", out)
    bf16 = r["bf16_peak_gflops"]
    if not kernels.bf16_units() or not _kernels_buildable():
      # Its products run on the float32 FMA units, converted.
      self.assertIsNone(bf16)
      self.assertIn(" bf16_peak_gflops=unknown ", out)
      peak = r["fma_peak_gflops"]
    else:
      self.assertGreater(bf16, r["fma_peak_gflops"])
      peak = bf16
    if peak:
      self.assertAllClose(r["peak_fraction"], r["gflops"] / peak)
      self.assertAllClose(r["compute_roof_wps"],
                          peak * 1e9 / r["train_flops_per_word"])

  def testAPlanInFloat32IsBoundByTheFmaPeak(self):
    # The planner kept every product in float32 (bfloat16 no faster there):
    # the step is of float32 products, bound by the FMA units.
    real = benchmark.planner.make
    def make(*args, **kwargs):
      return real(*args, **dict(kwargs, products=bfloat16.FLOAT32))
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      out_json = os.path.join(tmp, "bench.json")
      with mock.patch.object(benchmark.planner, "make", make):
        out = run_benchmark([
            "--data_path=" + tmp, "--model=test", "--num_gpus=0",
            "--steps=2", "--warmup=1", "--use_bf16", "--force_bf16",
            "--output_json=" + out_json])
      with open(out_json) as f:
        r = json.load(f)["results"][0]
    self.assertEqual((r["products"], r["plan"]["products"]),
                     ("float32", "float32"))
    self.assertNotIn("bf16_peak_gflops=", out)
    if r["fma_peak_gflops"]:
      self.assertAllClose(r["peak_fraction"],
                          r["gflops"] / r["fma_peak_gflops"])


class ProfileTest(tf.test.TestCase):

  def testSharesAddUpToTheTracedStepAndAreDrawn(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      png, out_json = (os.path.join(tmp, n) for n in ("p.png", "b.json"))
      out = run_benchmark([
          "--data_path=" + tmp, "--model=test", "--num_gpus=0", "--steps=2",
          "--warmup=1", "--profile=" + png, "--output_json=" + out_json,
          "--config_overrides=vocab_size=100,hidden_size=512,num_steps=20,"
          "batch_size=64",
          "--plan=estimate"])
      lines = [l for l in out.splitlines() if l.startswith("profile: ")]
      self.assertLen(lines, 1)
      self.assertIn("recurrent products", lines[0])
      with open(out_json) as f:
        result = json.load(f)["results"][0]
      parts = result["profile_seconds"]
      self.assertEqual(sorted(parts), sorted(profile_lib.PARTS))
      self.assertAllClose(sum(parts.values()),
                          result["profile_busy_seconds"])
      # Within 10 % of the traced step: the gaps between ops are small.
      self.assertGreater(result["profile_busy_seconds"],
                         0.9 * result["profile_step_seconds"])
      with open(png, "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class EvalUnrollTest(tf.test.TestCase):
  """Many windows per session call give the perplexities of one per call."""

  def testPerplexitiesDoNotDependOnEvalUnroll(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      figures = []
      for unroll in ("1", "7", "200"):
        out, err, stop = run_in_process([
            "--data_path=" + tmp, "--model=test", "--num_gpus=0", "--seed=2",
            "--eval_unroll=" + unroll])
        self.assertIsNone(stop, err)
        figures.append([float(v) for v in re.findall(
            r"(?:Valid|Test) Perplexity: (\S+)", out)])
    self.assertLen(figures[0], 2)
    for other in figures[1:]:
      self.assertAllClose(other, figures[0], rtol=1e-4)


if __name__ == "__main__":
  tf.test.main()
