"""Tests of benchmark.py."""

import json
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import tensorflow as tf

from ptb import kernels
from ptb import testing
import benchmark
import ptb_word_lm


def _kernels_buildable():
  """Whether a benchmark.py process can build and use lstm_kernels here."""
  return kernels.kernel_isa()[0] is not None and kernels.compiler_found()


def _softmax_path():
  """What benchmark.py should report for a float32 model on this CPU."""
  return "kernel" if _kernels_buildable() else "ops"


def _peak_fields():
  """The FMA-peak fields benchmark.py should print here, as a regex."""
  if not _kernels_buildable():
    return "fma_peak_gflops=unknown peak_fraction=unknown isa=none"
  return (r"fma_peak_gflops=\S+ peak_fraction=\S+ isa=%s"
          % kernels.kernel_isa()[0])


def _roofline_fields():
  """The roofline fields benchmark.py should print here, as a regex."""
  measured = _kernels_buildable()
  known = lambda pattern: pattern if measured else "unknown"
  return (r"bandwidth_gbs=%s train_bytes_per_word=\S+ gbs=\S+ "
          r"bandwidth_fraction=%s compute_roof_wps=%s bandwidth_roof_wps=%s "
          r"bound=%s roof_fraction=%s" % (
              known(r"\S+"), known(r"\S+"), known(r"\d+"), known(r"\d+"),
              known("(compute|bandwidth)"), known(r"\S+")))


class BenchmarkTest(tf.test.TestCase):

  def testTrainFlopsPerWord(self):
    # small: 2 layers of [400 x 800] gates, softmax [200 x 10000]; forward
    # 2 * (2*400*800) + 2*200*10000 FLOPs, training three times that.
    self.assertEqual(benchmark.train_flops_per_word(ptb_word_lm.SmallConfig()),
                     3 * (2 * 2 * 400 * 800 + 2 * 200 * 10000))
    self.assertEqual(benchmark.train_flops_per_word(ptb_word_lm.LargeConfig()),
                     3 * (2 * 2 * 3000 * 6000 + 2 * 1500 * 10000))

  def testTrainBytesPerWord(self):
    # The how-to's class: 2 layers of [2000 x 4000] kernels and [4000]
    # biases, softmax [1000 x 10000] and [10000]; 20 x 2 words a step.
    config = ptb_word_lm.LargeConfig()
    config.num_steps, config.hidden_size = 2, 1000
    dense = 2 * (2000 * 4000 + 4000) + 1000 * 10000 + 10000
    want = (12 * dense / 40 + 12 * 1000 +
            4 * (2 * 2 * (8 * 1000 + 4 * 1000) + 4 * 10000))
    self.assertAllClose(benchmark.train_bytes_per_word(config), want)

  def testRooflineTakesTheLowerRoof(self):
    config = ptb_word_lm.SmallConfig()
    per_word = benchmark.train_bytes_per_word(config)
    r = {"wps": 1000.0, "train_flops_per_word": 1e6}
    # Compute allows 100 GFLOP/s / 1 MFLOP = 100,000 wps; the bandwidth
    # 10 GB/s / per_word.
    got = benchmark.roofline(r, config, 100.0, 10.0)
    self.assertAllClose(got["compute_roof_wps"], 1e5)
    self.assertAllClose(got["bandwidth_roof_wps"], 1e10 / per_word)
    self.assertEqual(got["bound"], "bandwidth" if 1e10 / per_word < 1e5
                     else "compute")
    self.assertAllClose(got["roof_fraction"],
                        1000 / min(1e5, 1e10 / per_word))
    self.assertAllClose(got["gbs"], 1000 * per_word / 1e9)
    self.assertAllClose(got["bandwidth_fraction"], got["gbs"] / 10.0)
    # One roof unknown: the other bounds; both unknown: no bound.
    self.assertEqual(benchmark.roofline(r, config, 100.0, None)["bound"],
                     "compute")
    self.assertEqual(benchmark.roofline(r, config, None, 1e6)["bound"],
                     "bandwidth")
    none = benchmark.roofline(r, config, None, None)
    self.assertIsNone(none["bound"])
    self.assertIsNone(none["roof_fraction"])

  def testLastLevelCacheFromSysfs(self):
    with tempfile.TemporaryDirectory() as tmp:
      for index, level, size in ((0, 1, "32K"), (2, 2, "512K"),
                                 (3, 3, "32768K")):
        os.makedirs(os.path.join(tmp, "index%d" % index))
        for name, value in (("level", str(level)), ("size", size)):
          with open(os.path.join(tmp, "index%d" % index, name), "w") as f:
            f.write(value + "\n")
      with open(os.path.join(tmp, "uevent"), "w") as f:
        f.write("")
      self.assertEqual(benchmark.llc_bytes(tmp), 32 << 20)
      self.assertIsNone(benchmark.llc_bytes(os.path.join(tmp, "none")))

  def testMemoryBandwidthOrNone(self):
    with mock.patch.object(kernels, "kernel_isa",
                           return_value=(None, "no width")):
      self.assertIsNone(benchmark.memory_bandwidth(None))
    if _kernels_buildable():
      # Any memory system of this century streams more than 0.5 GB/s.
      self.assertGreater(
          benchmark.memory_bandwidth(None, array_bytes=8 << 20, trials=1),
          0.5)

  def testFmaPeakInTheKernelsWidthOrNone(self):
    with mock.patch.object(kernels, "kernel_isa",
                           return_value=(None, "no width")):
      self.assertIsNone(benchmark.fma_peak(None))
    if _kernels_buildable():
      # One core at 1 GHz with one 8-lane FMA unit does 16 GFLOP/s.
      self.assertGreater(benchmark.fma_peak(None, seconds=0.01, trials=2), 16)

  def testEveryCombinationAndJson(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      out_json = os.path.join(tmp, "bench.json")
      proc = subprocess.run(
          [sys.executable, os.path.join(testing.HERE, "benchmark.py"),
           "--data_path=" + tmp, "--model=test", "--rnn_mode=BASIC,block",
           "--num_gpus=0", "--steps=3", "--warmup=1",
           "--config_overrides=vocab_size=100", "--output_json=" + out_json],
          capture_output=True, text=True, timeout=600,
          # benchmark.py turns oneDNN on by itself (ptb/onednn.py).
          env={k: v for k, v in os.environ.items()
               if k != "TF_ENABLE_ONEDNN_OPTS"})
      self.assertEqual(proc.returncode, 0, proc.stderr)
      with open(out_json) as f:
        report = json.load(f)
    lines = proc.stdout.splitlines()
    rows = [l for l in lines if l.startswith("model=")]
    self.assertLen(rows, 2)
    self.assertRegex(rows[0], r"^model=test rnn_mode=BASIC wps=\d+ "
                     r"train_flops_per_word=\S+ gflops=\S+ "
                     r"ceiling_gflops=\S+ mfu=\S+ %s %s peak_rss_mib=\d+ "
                     r"recurrent=matmul softmax=%s matmul=onednn$"
                     % (_peak_fields(), _roofline_fields(), _softmax_path()))
    self.assertIn("rnn_mode=BLOCK", rows[1])
    self.assertRegex(lines[-1], r"^wps: \d+$")
    results = report["results"]
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
        self.assertEqual(r["kernel_isa"], kernels.kernel_isa()[0])
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

  def testReportsTheKernelsWhereTheModelUsesThem(self):
    # Hidden 512, batch 8 and 8 steps are where the model starts to use the
    # kernels' recurrent products.
    want = "kernels" if _kernels_buildable() else "matmul"
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      proc = subprocess.run(
          [sys.executable, os.path.join(testing.HERE, "benchmark.py"),
           "--data_path=" + tmp, "--model=test", "--num_gpus=0", "--steps=2",
           "--warmup=1",
           "--config_overrides=vocab_size=100,hidden_size=512,batch_size=10,"
           "num_steps=8"],
          capture_output=True, text=True, timeout=600,
          env=dict(os.environ, PTB_KERNEL_DIR=tmp, TF_ENABLE_ONEDNN_OPTS="0"))
      self.assertEqual(proc.returncode, 0, proc.stderr)
    rows = [l for l in proc.stdout.splitlines() if l.startswith("model=")]
    self.assertLen(rows, 1)
    self.assertTrue(rows[0].endswith(
        # The user's TF_ENABLE_ONEDNN_OPTS=0 wins.
        " recurrent=%s softmax=%s matmul=eigen" % (want, _softmax_path())),
        rows[0])


class EvalUnrollTest(tf.test.TestCase):
  """Many windows per session call give the perplexities of one per call."""

  def testPerplexitiesDoNotDependOnEvalUnroll(self):
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      figures = []
      for unroll in ("1", "7", "200"):
        code, out, err = testing.run_script(
            "--data_path=" + tmp, "--model=test", "--num_gpus=0", "--seed=2",
            "--eval_unroll=" + unroll)
        self.assertEqual(code, 0, err)
        figures.append([float(v) for v in re.findall(
            r"(?:Valid|Test) Perplexity: (\S+)", out)])
    self.assertLen(figures[0], 2)
    for other in figures[1:]:
      self.assertAllClose(other, figures[0], rtol=1e-4)


if __name__ == "__main__":
  tf.test.main()
