"""Tests of ptb/roofline.py: the FLOPs and bytes a word, and the picture."""

import json
import os
import sys
import tempfile
import types
from unittest import mock

import tensorflow as tf

from ptb import roofline
from ptb.errors import UserError
import ptb_word_lm
import ptb_word_lm_testing

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tiny_config():
  """One layer of hidden 2, vocabulary 3, a step of 1 x 2 words."""
  return types.SimpleNamespace(hidden_size=2, vocab_size=3, num_layers=1,
                               batch_size=1, num_steps=2)


def result(model, products=None, gflops=100.0, flops=3e8, bytes_=1.5e6,
           **limits):
  """A benchmark result as benchmark.py writes one, with `limits` in it."""
  r = {"model": model, "rnn_mode": "BASIC", "gflops": gflops, "wps": 500.0,
       "train_flops_per_word": flops, "train_bytes_per_word": bytes_}
  if products:
    r["products"] = products
  r.update(limits)
  return r


def lines(fig, gid):
  """The lines of the figure's axes with the gid `gid`."""
  return [l for l in fig.axes[0].get_lines() if l.get_gid() == gid]


def legend_texts(fig):
  """The texts of the figure's legend."""
  return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


class FlopsAndBytesTest(tf.test.TestCase):

  def testTrainFlopsPerWord(self):
    # small: 2 layers of [400 x 800] gates, softmax [200 x 10000]; forward
    # 2 * (2*400*800) + 2*200*10000 FLOPs, training three times that.
    self.assertEqual(roofline.train_flops_per_word(ptb_word_lm.SmallConfig()),
                     3 * (2 * 2 * 400 * 800 + 2 * 200 * 10000))
    self.assertEqual(roofline.train_flops_per_word(ptb_word_lm.LargeConfig()),
                     3 * (2 * 2 * 3000 * 6000 + 2 * 1500 * 10000))

  def testTrainBytesPerWord(self):
    # The how-to's class: 2 layers of [2000 x 4000] kernels and [4000]
    # biases, softmax [1000 x 10000] and [10000]; 20 x 2 words a step.
    config = ptb_word_lm.LargeConfig()
    config.num_steps, config.hidden_size = 2, 1000
    dense = 2 * (2000 * 4000 + 4000) + 1000 * 10000 + 10000
    want = (12 * dense / 40 + 12 * 1000 +
            4 * (2 * 2 * (8 * 1000 + 4 * 1000) + 4 * 10000))
    self.assertAllClose(roofline.train_bytes_per_word(config), want)
    self.assertEqual(roofline.train_bytes_per_word(config, "float32"),
                     roofline.train_bytes_per_word(config))

  def testTinyConfigInBothDtypes(self):
    # Product weights: the kernel [4 x 8] and the softmax [2 x 3], 38;
    # biases [8] and [3], 11; 2 words a step. Embedding 12 x 2 bytes;
    # activations 4 x (2 x (16 + 8) + 4 x 3) = 240 bytes.
    # float32: 12 x 49 / 2 = 294 bytes of weights.
    self.assertEqual(roofline.train_bytes_per_word(tiny_config()),
                     294 + 24 + 240)
    # bfloat16: (12 x 38 + 12 x 11) / 2 = 294 bytes of weights: the update
    # reads the float32 master.
    self.assertEqual(roofline.train_bytes_per_word(tiny_config(), "bfloat16"),
                     294 + 24 + 240)

  def testUnknownProductsAreRefused(self):
    with self.assertRaisesRegex(ValueError, "float32, bfloat16"):
      roofline.train_bytes_per_word(tiny_config(), "float16")


class RooflineFiguresTest(tf.test.TestCase):

  def testTakesTheLowerRoof(self):
    config = ptb_word_lm.SmallConfig()
    per_word = roofline.train_bytes_per_word(config)
    r = {"wps": 1000.0, "train_flops_per_word": 1e6}
    # Compute allows 100 GFLOP/s / 1 MFLOP = 100,000 wps; the bandwidth
    # 10 GB/s / per_word.
    got = roofline.roofline(r, config, 100.0, 10.0)
    self.assertAllClose(got["compute_roof_wps"], 1e5)
    self.assertAllClose(got["bandwidth_roof_wps"], 1e10 / per_word)
    self.assertEqual(got["bound"], "bandwidth" if 1e10 / per_word < 1e5
                     else "compute")
    self.assertAllClose(got["roof_fraction"],
                        1000 / min(1e5, 1e10 / per_word))
    self.assertAllClose(got["gbs"], 1000 * per_word / 1e9)
    self.assertAllClose(got["bandwidth_fraction"], got["gbs"] / 10.0)
    # One roof unknown: the other bounds; both unknown: no bound.
    self.assertEqual(roofline.roofline(r, config, 100.0, None)["bound"],
                     "compute")
    self.assertEqual(roofline.roofline(r, config, None, 1e6)["bound"],
                     "bandwidth")
    none = roofline.roofline(r, config, None, None)
    self.assertIsNone(none["bound"])
    self.assertIsNone(none["roof_fraction"])

  def testBfloat16ProductsMoveTheirBytes(self):
    r = {"wps": 10.0, "train_flops_per_word": 1e6}
    got = roofline.roofline(r, tiny_config(), 1.0, 1.0, "bfloat16")
    self.assertEqual(got["train_bytes_per_word"], 558)
    self.assertAllClose(got["gbs"], 10 * 558 / 1e9)
    self.assertAllClose(got["bandwidth_roof_wps"], 1e9 / 558)


class FigureTest(tf.test.TestCase):
  """The picture of synthetic results: its axes, points and roofs."""

  def setUp(self):
    super().setUp()
    self.f32 = result("large", "float32", gflops=100.0, flops=3e8,
                      bytes_=1.5e6, fma_peak_gflops=200.0,
                      ceiling_gflops=160.0, bandwidth_gbs=40.0)
    self.bf16 = result("large", "bfloat16", gflops=150.0, flops=3e8,
                       bytes_=1.2e6, fma_peak_gflops=190.0,
                       bf16_peak_gflops=800.0, ceiling_gflops=170.0,
                       bandwidth_gbs=35.0)

  def testAxesAreLogLogAndLabelled(self):
    ax = roofline.figure([self.f32], cpu="Test CPU").axes[0]
    self.assertEqual(ax.get_xscale(), "log")
    self.assertEqual(ax.get_yscale(), "log")
    self.assertIn("FLOPs per byte", ax.get_xlabel())
    self.assertEqual(ax.get_ylabel(), "GFLOP/s")
    self.assertEqual(ax.get_title(), "Roofline: Test CPU")

  def testEachResultIsAPointAtItsIntensity(self):
    fig = roofline.figure([self.f32, self.bf16], cpu="Test CPU")
    points = lines(fig, "result")
    self.assertEqual([p.get_label() for p in points],
                     ["large float32", "large bfloat16"])
    self.assertEqual(points[0].get_xydata().tolist(), [[200.0, 100.0]])
    self.assertEqual(points[1].get_xydata().tolist(), [[250.0, 150.0]])

  def testCeilingsAreTheHighestLimitsFromTheirRidges(self):
    fig = roofline.figure([self.f32, self.bf16], cpu="Test CPU")
    # The best of each limit: FMA 200, bfloat16 800, matmul 170, 40 GB/s.
    for gid, peak in (("fma_peak_gflops", 200.0), ("bf16_peak_gflops", 800.0),
                      ("ceiling_gflops", 170.0)):
      (line,) = lines(fig, gid)
      self.assertEqual(list(line.get_ydata()), [peak, peak])
      self.assertEqual(line.get_xdata()[0], peak / 40.0)
      self.assertIn("%.1f GFLOP/s" % peak, line.get_label())
    self.assertEqual(lines(fig, "ceiling_gflops")[0].get_linestyle(), "--")
    self.assertEqual(lines(fig, "fma_peak_gflops")[0].get_linestyle(), "-")

  def testBandwidthSlopeRisesToTheHighestCeiling(self):
    fig = roofline.figure([self.f32, self.bf16], cpu="Test CPU")
    (slope,) = lines(fig, "bandwidth")
    self.assertEqual(slope.get_label(), "memory bandwidth 40.0 GB/s")
    for x, y in slope.get_xydata():
      self.assertAllClose(y, 40.0 * x)
    self.assertEqual(slope.get_xdata()[-1], 800.0 / 40.0)

  def testBfloat16CeilingOnlyWhenGiven(self):
    # An older result: no products (float32), no bfloat16 peak.
    old = result("small", gflops=10.0, flops=1.6e7, bytes_=2.8e5,
                 fma_peak_gflops=200.0, bandwidth_gbs=40.0)
    fig = roofline.figure([old], cpu="Test CPU")
    self.assertEqual(lines(fig, "bf16_peak_gflops"), [])
    self.assertEqual(lines(fig, "ceiling_gflops"), [])
    self.assertEqual([p.get_label() for p in lines(fig, "result")],
                     ["small float32"])
    old["bf16_peak_gflops"] = None
    self.assertEqual(lines(roofline.figure([old], cpu="C"),
                           "bf16_peak_gflops"), [])
    self.assertNotIn("bfloat16 peak unknown",
                     legend_texts(roofline.figure([old], cpu="C")))
    # A bfloat16 result on a CPU whose bfloat16 peak is unknown says so.
    forced = dict(self.bf16, bf16_peak_gflops=None)
    fig = roofline.figure([self.f32, forced], cpu="C")
    self.assertEqual(lines(fig, "bf16_peak_gflops"), [])
    self.assertIn("bfloat16 peak unknown", legend_texts(fig))

  def testUnknownLimitsSaySo(self):
    fig = roofline.figure([result("small", fma_peak_gflops=None,
                                  bandwidth_gbs=None, ceiling_gflops=50.0)],
                          cpu="Test CPU")
    self.assertEqual(lines(fig, "bandwidth"), [])
    self.assertEqual(lines(fig, "fma_peak_gflops"), [])
    self.assertIn("float32 FMA peak unknown", legend_texts(fig))
    self.assertIn("memory bandwidth unknown", legend_texts(fig))
    (ceiling,) = lines(fig, "ceiling_gflops")
    self.assertEqual(list(ceiling.get_ydata()), [50.0, 50.0])

  def testSameModelAndDtypeAreToldApartByMode(self):
    block = dict(self.f32, rnn_mode="BLOCK")
    fig = roofline.figure([self.f32, block], cpu="Test CPU")
    self.assertEqual([p.get_label() for p in lines(fig, "result")],
                     ["large float32 BASIC", "large float32 BLOCK"])

  def testConfigOverridesNameTheirResult(self):
    howto = dict(self.f32, rnn_mode="BLOCK",
                 config_overrides="num_steps=2,hidden_size=1000")
    fig = roofline.figure([self.f32, howto], cpu="Test CPU")
    self.assertEqual([p.get_label() for p in lines(fig, "result")],
                     ["large float32",
                      "large (num_steps=2,hidden_size=1000) float32"])

  def testTitleFromTheResultsOrThisMachine(self):
    carried = dict(self.f32, cpu="AMD EPYC", tensorflow="2.21.0")
    self.assertEqual(roofline.figure([carried]).axes[0].get_title(),
                     "Roofline: AMD EPYC, TensorFlow 2.21.0")
    with mock.patch.object(roofline, "cpu_model", return_value="Here CPU"):
      self.assertEqual(roofline.figure([self.f32]).axes[0].get_title(),
                       "Roofline: Here CPU")

  def testDrawWritesAPng(self):
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "new", "roofline.png")
      self.assertEqual(roofline.draw([self.f32, self.bf16], path, cpu="C"),
                       path)
      with open(path, "rb") as f:
        self.assertEqual(f.read(8), _PNG_SIGNATURE)

  def testWithoutMatplotlibOneLine(self):
    with mock.patch.dict(sys.modules, {"matplotlib.figure": None}):
      with self.assertRaisesRegex(
          UserError, "needs matplotlib.*pip install -r "
          "requirements-plot.txt$"):
        roofline.figure([self.f32], cpu="C")
    with tempfile.TemporaryDirectory() as tmp:
      with mock.patch("importlib.util.find_spec", return_value=None):
        with self.assertRaisesRegex(UserError, "requirements-plot.txt"):
          roofline.check_output("roofline", os.path.join(tmp, "r.png"))
      with self.assertRaisesRegex(UserError, r"ending in \.png, \.pdf"):
        roofline.check_output("roofline", os.path.join(tmp, "r.txt"))
      roofline.check_output("roofline", os.path.join(tmp, "r.svg"))


class LoadAndLimitsTest(ptb_word_lm_testing.SavePathTest):
  """Results read from files of the test's own (in self.tmp)."""

  def _write(self, name, content):
    """A file of the test's own with `content` (JSON unless a str)."""
    path = os.path.join(self.tmp, name)
    with open(path, "w") as f:
      f.write(content if isinstance(content, str) else json.dumps(content))
    return path

  def testResultsOfSeveralFilesCarryTheirFiles(self):
    a = self._write("a.json", {"tensorflow": "2.21.0", "cpu": "AMD EPYC",
                               "results": [result("small", "float32")]})
    b = self._write("b.json", {"results": [
        result("small", "bfloat16", cpu="Other")]})
    got = roofline.load_results([a, b])
    self.assertEqual([(r["products"], r.get("cpu"), r.get("tensorflow"))
                      for r in got],
                     [("float32", "AMD EPYC", "2.21.0"),
                      ("bfloat16", "Other", None)])

  def testBadFilesAreOneLineUsageErrors(self):
    cases = [
        (os.path.join(self.tmp, "none.json"),
         "none.json cannot be read: No such file or directory"),
        (self._write("bad.json", "{not json"), "bad.json is not JSON"),
        (self._write("summary.json", {"epochs": []}),
         "summary.json is not benchmark.py's --output_json: it has no list "
         "of \"results\""),
        (self._write("empty.json", {"results": []}),
         "empty.json has no results to draw"),
        (self._write("nogflops.json", {"results": [
            {"model": "small", "train_flops_per_word": 1.0,
             "train_bytes_per_word": 1.0}]}),
         "nogflops.json: result 1 has no positive gflops"),
        (self._write("peak.json", {"results": [
            result("small", fma_peak_gflops="fast")]}),
         "has a fma_peak_gflops that is no positive number: 'fast'"),
        (self._write("dtype.json", {"results": [result("small", "int8")]}),
         "has products='int8'; it must be float32 or bfloat16"),
    ]
    for path, message in cases:
      with self.subTest(path=path):
        with self.assertRaises(UserError) as raised:
          roofline.load_results([path])
        self.assertEqual(raised.exception.exit_code, 2)
        self.assertTrue(str(raised.exception).startswith(
            "--roofline_from=" + path))
        self.assertIn(message, str(raised.exception))
        self.assertNotIn("\n", str(raised.exception))

  def testLimitsAreTheHighestMeasured(self):
    got = roofline.limits([
        result("a", fma_peak_gflops=200.0, bandwidth_gbs=None),
        result("b", fma_peak_gflops=210.0, bandwidth_gbs=30.0,
               bf16_peak_gflops=None)])
    self.assertEqual(got, {"fma_peak_gflops": 210.0, "bf16_peak_gflops": None,
                           "ceiling_gflops": None, "bandwidth_gbs": 30.0})

  def testCpuModelFromCpuinfo(self):
    path = self._write("cpuinfo", "processor\t: 0\nvendor_id\t: X\n"
                       "model name\t: AMD EPYC 9B14\nflags\t\t: fma\n")
    self.assertEqual(roofline.cpu_model(path), "AMD EPYC 9B14")
    self.assertIsNone(roofline.cpu_model(self._write("empty", "")))
    self.assertIsNone(roofline.cpu_model(os.path.join(self.tmp, "none")))


if __name__ == "__main__":
  tf.test.main()
