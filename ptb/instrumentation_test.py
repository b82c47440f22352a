"""End-to-end test of --memory_log, --summary_json and plot_run.py.

ptb_word_lm.py runs as a program: a whole training run through its command
line, with the settings its start makes (oneDNN on).
"""

import csv
import itertools
import json
import math
import os
import re
import tempfile

import tensorflow as tf

from ptb import plan_test
from ptb import testing
import plot_run

INTERVAL = 0.1


class InstrumentationTest(tf.test.TestCase):

  def testMemoryLogSummaryAndPlot(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = os.path.join(tmp, "data")
      os.mkdir(data)
      testing.make_corpus(data)
      csv_path = os.path.join(tmp, "memory.csv")
      json_path = os.path.join(tmp, "summary.json")
      code, out, err = testing.run_script(
          "--data_path=" + data, "--model=test", "--num_gpus=0",
          "--config_overrides=max_max_epoch=2",
          "--memory_log=" + csv_path, "--memory_interval=%s" % INTERVAL,
          "--summary_json=" + json_path,
          # The script turns oneDNN on by itself (ptb/onednn.py).
          env={k: v for k, v in os.environ.items()
               if k != "TF_ENABLE_ONEDNN_OPTS"})
      self.assertEqual(code, 0, err)

      with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
      self.assertEqual(reader.fieldnames, ["seconds", "rss_mib", "phase",
                                           "epoch", "step"])
      # Nothing here depends on how many interval rows a loaded machine
      # managed: start(), each change of phase or epoch and stop() write a
      # row of their own, and interval rows only repeat the current one.
      for row in rows:
        self.assertNotIn(None, row)  # no row longer than the header
        self.assertNotIn(None, row.values())  # nor shorter
      seconds = [float(r["seconds"]) for r in rows]
      self.assertGreaterEqual(seconds[0], 0)
      self.assertEqual(seconds, sorted(seconds))
      self.assertTrue(all(float(r["rss_mib"]) > 50 for r in rows))
      where = [(r["phase"], int(r["epoch"]), int(r["step"])) for r in rows]
      blocks = [(phase, epoch, [s for _, _, s in group]) for (phase, epoch),
                group in itertools.groupby(where, key=lambda w: w[:2])]
      self.assertEqual([b[:2] for b in blocks],
                       [("startup", 0), ("train", 1), ("valid", 1),
                        ("train", 2), ("valid", 2), ("test", 2)])
      self.assertEqual(blocks[0][2], [0] * len(blocks[0][2]))
      for phase, epoch, steps in blocks[1:]:
        # Each phase's row is written at its first step; steps only grow.
        self.assertEqual(steps[0], 0, (phase, epoch))
        self.assertEqual(steps, sorted(steps), (phase, epoch))
      # start(), one row per phase change, stop().
      self.assertGreaterEqual(len(rows), len(blocks) + 1)
      self.assertGreater(blocks[-1][2][-1], 0)  # stop() after the test pass
      duration = seconds[-1]

      with open(json_path) as f:
        summary = json.load(f)
      self.assertEqual(summary["status"], "finished")
      self.assertEqual(summary["model"], "test")
      self.assertEqual(summary["rnn_mode"], "BASIC")
      self.assertIn("--model=test", summary["command"])
      self.assertEqual(summary["config"]["max_max_epoch"], 2)
      self.assertEqual(summary["config"]["hidden_size"], 2)
      self.assertEqual(summary["tensorflow_version"], tf.__version__)
      self.assertEqual(summary["matmul"], "onednn")
      self.assertRegex(summary["python_version"], r"^3\.\d+\.\d+$")
      self.assertEqual(summary["devices"], ["/cpu:0"])
      # The plan printed on stderr at start-up, and recorded.
      plan_test.assert_recorded(self, summary["plan"],
                                *plan_test.printed_plan(err))
      self.assertLen(summary["epochs"], 2)
      printed = [float(v) for v in
                 re.findall(r"Valid Perplexity: (\S+)", out)]
      printed_train = [float(v) for v in
                       re.findall(r"Train Perplexity: (\S+)", out)]
      with open(os.path.join(data, "ptb.train.txt")) as f:
        tokens = len(f.read().replace("\n", " <eos> ").split())
      for i, epoch in enumerate(summary["epochs"]):
        self.assertEqual(epoch["epoch"], i + 1)
        self.assertEqual(epoch["learning_rate"], 0.5 ** i)
        self.assertAllClose(epoch["valid_perplexity"], printed[i], atol=1e-3)
        self.assertAllClose(epoch["train_perplexity"], printed_train[i],
                            atol=1e-3)
        self.assertGreater(epoch["train_seconds"], 0)
        self.assertGreater(epoch["valid_seconds"], 0)
        # Words over seconds, checked without assuming a speed: the words
        # are the corpus's tokens less those that do not fill a batch.
        self.assertBetween(epoch["train_wps"] * epoch["train_seconds"],
                           0.9 * tokens, tokens)
        self.assertAllClose(epoch["train_wps"] * epoch["train_seconds"],
                            epoch["train_calls"] * summary["config"]
                            ["batch_size"] * summary["config"]["num_steps"])
      self.assertAllClose(*[e["train_wps"] * e["train_seconds"]
                            for e in summary["epochs"]])  # the same words
      test = float(re.search(r"Test Perplexity: (\S+)", out).group(1))
      self.assertAllClose(summary["test_perplexity"], test, atol=1e-3)
      self.assertTrue(math.isfinite(summary["test_perplexity"]))
      self.assertGreaterEqual(summary["wall_seconds"], duration - 1)
      peak = float(re.search(r"Peak RSS: (\d+) MiB", out).group(1))
      self.assertAllClose(summary["peak_rss_mib"], peak, atol=1.0)
      self.assertGreaterEqual(
          summary["peak_rss_mib"] + 1,
          max(float(r["rss_mib"]) for r in rows))

      # plot_run.py's whole run on these files, in this process (its own
      # command line is plot_run_test's).
      png = os.path.join(tmp, "run.png")
      self.assertEqual(plot_run.run(
          ["plot_run.py", "--summary_json=" + json_path,
           "--memory_csv=" + csv_path, "--output=" + png]), 0)
      with open(png, "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
      self.assertGreater(os.path.getsize(png), 10000)


if __name__ == "__main__":
  tf.test.main()
