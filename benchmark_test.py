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


class BenchmarkTest(tf.test.TestCase):

  def testTrainFlopsPerWord(self):
    # small: 2 layers of [400 x 800] gates, softmax [200 x 10000]; forward
    # 2 * (2*400*800) + 2*200*10000 FLOPs, training three times that.
    self.assertEqual(benchmark.train_flops_per_word(ptb_word_lm.SmallConfig()),
                     3 * (2 * 2 * 400 * 800 + 2 * 200 * 10000))
    self.assertEqual(benchmark.train_flops_per_word(ptb_word_lm.LargeConfig()),
                     3 * (2 * 2 * 3000 * 6000 + 2 * 1500 * 10000))

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
                     r"ceiling_gflops=\S+ mfu=\S+ %s peak_rss_mib=\d+ "
                     r"recurrent=matmul softmax=%s matmul=onednn$"
                     % (_peak_fields(), _softmax_path()))
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
      else:
        self.assertIsNone(r["fma_peak_gflops"])
        self.assertIsNone(r["peak_fraction"])

  def testReportsTheKernelsWhereTheModelUsesThem(self):
    # Hidden 512 is where the model starts to use the kernels' ops.
    want = "kernels" if _kernels_buildable() else "matmul"
    with tempfile.TemporaryDirectory() as tmp:
      testing.make_corpus(tmp)
      proc = subprocess.run(
          [sys.executable, os.path.join(testing.HERE, "benchmark.py"),
           "--data_path=" + tmp, "--model=test", "--num_gpus=0", "--steps=2",
           "--warmup=1",
           "--config_overrides=vocab_size=100,hidden_size=512,batch_size=10"],
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
