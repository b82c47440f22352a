"""End-to-end test of --memory_log, --summary_json and plot_run.py."""

import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import tensorflow as tf

import ptb_word_lm_test as lm_test

INTERVAL = 0.1


class InstrumentationTest(tf.test.TestCase):

  def testMemoryLogSummaryAndPlot(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = os.path.join(tmp, "data")
      os.mkdir(data)
      lm_test.make_corpus(data, train_lines=3000)
      csv_path = os.path.join(tmp, "memory.csv")
      json_path = os.path.join(tmp, "summary.json")
      code, out, err = lm_test.run_script(
          "--data_path=" + data, "--model=test", "--num_gpus=0",
          "--config_overrides=max_max_epoch=2",
          "--memory_log=" + csv_path, "--memory_interval=%s" % INTERVAL,
          "--summary_json=" + json_path)
      self.assertEqual(code, 0, err)

      with open(csv_path) as f:
        rows = list(csv.DictReader(f))
      self.assertEqual(list(rows[0]), ["seconds", "rss_mib", "phase", "epoch",
                                       "step"])
      duration = float(rows[-1]["seconds"])
      # One row at the start, one per interval, one at the end; sampling
      # jitter may lose a few.
      self.assertGreaterEqual(len(rows), 0.8 * duration / INTERVAL)
      seconds = [float(r["seconds"]) for r in rows]
      self.assertEqual(seconds, sorted(seconds))
      self.assertTrue(all(float(r["rss_mib"]) > 50 for r in rows))
      phases = [r["phase"] for r in rows]
      self.assertEqual(phases[0], "startup")
      self.assertContainsSubset({"startup", "train", "valid"}, set(phases))
      self.assertEqual({r["epoch"] for r in rows if r["phase"] == "train"},
                       {"1", "2"})

      with open(json_path) as f:
        summary = json.load(f)
      self.assertEqual(summary["status"], "finished")
      self.assertEqual(summary["model"], "test")
      self.assertEqual(summary["rnn_mode"], "BASIC")
      self.assertIn("--model=test", summary["command"])
      self.assertEqual(summary["config"]["max_max_epoch"], 2)
      self.assertEqual(summary["config"]["hidden_size"], 2)
      self.assertEqual(summary["tensorflow_version"], tf.__version__)
      self.assertRegex(summary["python_version"], r"^3\.\d+\.\d+$")
      self.assertEqual(summary["devices"], ["/cpu:0"])
      self.assertLen(summary["epochs"], 2)
      printed = [float(v) for v in
                 re.findall(r"Valid Perplexity: (\S+)", out)]
      for i, epoch in enumerate(summary["epochs"]):
        self.assertEqual(epoch["epoch"], i + 1)
        self.assertEqual(epoch["learning_rate"], 0.5 ** i)
        self.assertAllClose(epoch["valid_perplexity"], printed[i], atol=1e-3)
        self.assertGreater(epoch["train_perplexity"], 1)
        self.assertGreater(epoch["train_wps"], 100)
        self.assertGreater(epoch["train_seconds"], 0)
        self.assertGreater(epoch["valid_seconds"], 0)
      test = float(re.search(r"Test Perplexity: (\S+)", out).group(1))
      self.assertAllClose(summary["test_perplexity"], test, atol=1e-3)
      self.assertTrue(math.isfinite(summary["test_perplexity"]))
      self.assertGreaterEqual(summary["wall_seconds"], duration - 1)
      peak = float(re.search(r"Peak RSS: (\d+) MiB", out).group(1))
      self.assertAllClose(summary["peak_rss_mib"], peak, atol=1.0)
      self.assertGreaterEqual(
          summary["peak_rss_mib"] + 1,
          max(float(r["rss_mib"]) for r in rows))

      png = os.path.join(tmp, "run.png")
      proc = subprocess.run(
          [sys.executable, os.path.join(lm_test.HERE, "plot_run.py"),
           "--summary_json=" + json_path, "--memory_csv=" + csv_path,
           "--output=" + png], capture_output=True, text=True, timeout=300)
      self.assertEqual(proc.returncode, 0, proc.stderr)
      with open(png, "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
      self.assertGreater(os.path.getsize(png), 10000)


if __name__ == "__main__":
  tf.test.main()
