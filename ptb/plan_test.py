"""Tests of ptb/plan.py: each choice and the printed plan.

The plan printed is the path that ran: runs of main in the test's process,
whose graphs' ops are checked against the line they print.
"""

import json
import os
import re
import tempfile
from unittest import mock

import tensorflow as tf

from ptb import kernel_offer
from ptb import plan as plan_lib
from ptb import testing
from ptb.bfloat16 import BFLOAT16
from ptb.config import BASIC, BLOCK, CUDNN
import ptb_word_lm
from ptb_word_lm_testing import run_in_process



class Config(object):
  """The fields of a config that the plan reads."""

  def __init__(self, rnn_mode=BASIC, num_layers=2, hidden_size=650,
               batch_size=20, num_steps=35, vocab_size=10000):
    self.rnn_mode, self.num_layers = rnn_mode, num_layers
    self.hidden_size, self.vocab_size = hidden_size, vocab_size
    self.batch_size, self.num_steps = batch_size, num_steps


def _step(config, devices=("/cpu:0",), dtype=tf.float32, isa="avx2",
          training=True, workers=1):
  return plan_lib.step(config, config.batch_size, config.num_steps, devices,
                       dtype, plan_lib.Kernels(isa, "test"), training, workers)


class StepTest(tf.test.TestCase):

  def testPathAndCellByModeSizeAndKernels(self):
    # (mode, hidden, kernels' width) -> (path, chunk, cell, forward)
    cases = (((BASIC, 650, "avx2"), (plan_lib.WAVEFRONT, 4, "ops", "kernels")),
             ((BASIC, 1500, "avx2"), (plan_lib.LAYER, None, "ops", "kernels")),
             ((BASIC, 200, None), (plan_lib.WAVEFRONT, 4, "ops", "matmul")),
             ((BLOCK, 200, "avx512"),
              (plan_lib.WAVEFRONT, 4, "LstmCell", "matmul")),
             ((BLOCK, 1500, "avx2"),
              (plan_lib.LAYER, None, "LstmCell", "kernels")),
             ((BLOCK, 650, None),
              (plan_lib.BLOCK_LSTM, None, "BlockLSTM", "BlockLSTM")),
             ((CUDNN, 650, "avx2"), (plan_lib.CUDNN_RNN, None, "cuDNN",
                                     "cuDNN")))
    for (mode, hidden, isa), (path, chunk, cell, forward) in cases:
      lstm = _step(Config(mode, hidden_size=hidden), isa=isa).lstm
      self.assertEqual((lstm.paths, lstm.chunk, lstm.cell, lstm.forward),
                       ((path,) * 2, chunk, cell, forward),
                       msg=(mode, hidden, isa))

  def testKernelsOnlyWhereTheyPayAndCanRun(self):
    cases = (("medium", Config(), "/cpu:0", tf.float32, True),
             ("small hidden", Config(hidden_size=200), "/cpu:0", tf.float32,
              False),
             ("batch 1 (test pass)", Config(batch_size=1), "/cpu:0",
              tf.float32, False),
             ("2 steps (the how-to's class)",
              Config(hidden_size=1000, num_steps=2), "/cpu:0", tf.float32,
              False),
             ("float16", Config(), "/cpu:0", tf.float16, False),
             ("GPU tower", Config(), "/gpu:0", tf.float32, False))
    for name, config, device, dtype, wanted in cases:
      step = _step(config, (device,), dtype)
      self.assertEqual(step.lstm.forward == plan_lib.KERNELS, wanted,
                       msg=name)
      self.assertEqual(step.lstm.backward == plan_lib.KERNELS, wanted,
                       msg=name)
      on_cpu32 = device == "/cpu:0" and dtype == tf.float32
      self.assertEqual(step.softmax.loss, "kernel" if on_cpu32 else "ops",
                       msg=name)

  def testSwappedProductsByRowsAndWeight(self):
    # (config, device) -> (softmax, input gradients per block, backward).
    plain, swapped = plan_lib.PLAIN, plan_lib.SWAPPED
    cases = (
        ("the how-to's class", Config(hidden_size=1000, num_steps=2),
         "/cpu:0", (swapped, (swapped,), swapped)),
        ("medium", Config(), "/cpu:0", (plain, (swapped,) * 9, "kernels")),
        ("medium, batch 40: only the last chunk's 120 rows",
         Config(batch_size=40), "/cpu:0",
         (plain, (plain,) * 8 + (swapped,), "kernels")),
        ("small: a weight within the caches", Config(hidden_size=200),
         "/cpu:0", (plain, (plain,) * 9, "transposed")),
        ("large: 700 rows a block", Config(hidden_size=1500), "/cpu:0",
         (plain, (plain,), "kernels")),
        ("GPU", Config(hidden_size=1000, num_steps=2), "/gpu:0",
         (plain, (plain,), plain)))
    for name, config, device, want in cases:
      step = _step(config, (device,))
      self.assertEqual((step.softmax.input_gradient,
                        step.lstm.input_gradients, step.lstm.backward),
                       want, msg=name)

  def testFactorsForFewRowsOnOneTowerAndOneWorker(self):
    few = Config(hidden_size=1000, num_steps=2)   # 40 rows
    cases = (("few rows", few, {}, plan_lib.FACTORS),
             ("400 rows", Config(hidden_size=200, num_steps=20), {},
              plan_lib.DENSE),
             ("no kernels", few, {"isa": None}, plan_lib.DENSE),
             ("float16", few, {"dtype": tf.float16}, plan_lib.DENSE),
             ("two towers", few, {"devices": ("/cpu:0", "/cpu:1")},
              plan_lib.DENSE),
             ("two workers", few, {"workers": 2}, plan_lib.DENSE),
             ("evaluation", few, {"training": False}, None))
    for name, config, args, want in cases:
      step = _step(config, **args)
      self.assertEqual(step.updates, want, msg=name)
      self.assertEqual(step.isa,
                       "avx2" if want == plan_lib.FACTORS else None, msg=name)

  def testEvaluationCallsHaveNoBackwardPass(self):
    config = Config()
    test_config = Config(batch_size=1, num_steps=1)
    plan = plan_lib.make(config, ["/cpu:0", "/cpu:1"], tf.float32,
                         plan_lib.Kernels("avx2", "test"), 1, test_config, 20)
    self.assertEqual((plan.train.batch, plan.train.steps), (20, 35))
    self.assertEqual(plan.train.updates, plan_lib.DENSE)  # two towers
    self.assertEqual((plan.valid.batch, plan.valid.steps), (20, 35))
    self.assertEqual((plan.test.batch, plan.test.steps), (1, 20))
    for step in (plan.valid, plan.test):
      self.assertIsNone(step.lstm.backward)
      self.assertEqual(step.lstm.input_gradients, ())
      self.assertIsNone(step.updates)
    self.assertEqual(plan.valid.lstm.forward, plan_lib.KERNELS)
    self.assertEqual(plan.test.lstm.forward, plan_lib.MATMUL)

  def testThresholdsAreArguments(self):
    limits = plan_lib.THRESHOLDS._replace(kernel_min_hidden=0,
                                          wavefront_below_hidden=0)
    lstm = plan_lib.lstm(BASIC, 1, 8, 8, 8, isa="avx2", limits=limits)
    self.assertEqual((lstm.paths, lstm.forward, lstm.isa),
                     ((plan_lib.LAYER,), plan_lib.KERNELS, "avx2"))


class LineTest(tf.test.TestCase):

  def testOneLineOfFieldsAndTheRecord(self):
    config = Config(hidden_size=1000, num_steps=2)
    plan = plan_lib.make(config, ["/cpu:0"], tf.float32,
                         plan_lib.Kernels("avx512", "the widest this CPU has"),
                         1, Config(batch_size=1, num_steps=1), 20)
    self.assertEqual(
        plan_lib.line(plan),
        "Plan: kernels=avx512 (the widest this CPU has) "
        "lstm=wavefront,wavefront chunk=4 cell=ops recurrent=matmul "
        "backward=swapped recurrent_valid=kernels recurrent_test=matmul "
        "softmax=kernel updates=factors swapped=softmax,inputs,recurrent "
        "products=float32 plan=estimate (the rules of ptb/plan.py)")
    record = plan_lib.record(plan)
    self.assertEqual(record.pop("kernels_why"), "the widest this CPU has")
    self.assertEqual(record.pop("plan_why"), "the rules of ptb/plan.py")
    self.assertEqual(record, dict(plan_lib.fields(plan)))
    json.dumps(record)  # the summary's field
    alone = plan_lib.make(config, ["/cpu:0"], tf.float32,
                          plan_lib.Kernels(None, "disabled"))
    self.assertNotIn("recurrent_valid", plan_lib.fields(alone))
    self.assertEqual(plan_lib.fields(alone)["kernels"], "none")
    # --original_norm_threads: the training step's norm, said before plan=.
    self.assertIs(plan_lib.with_original_norm(plan, 0), plan)
    original = plan_lib.with_original_norm(plan, 2)
    self.assertEqual((original.train.norm_threads, original.valid),
                     (2, plan.valid))
    self.assertIn(" products=float32 norm=tf1.5x2 plan=estimate",
                  plan_lib.line(original))


  def testBfloat16ProductsRunOnMatmulBesideTheKernelsFloat32Ops(self):
    # large's step: its float32 recurrent products run on the kernels.
    config = Config(rnn_mode=BLOCK, hidden_size=1500)
    kernels = plan_lib.Kernels("avx512", "the widest this CPU has")
    f32 = plan_lib.make(config, ["/cpu:0"], tf.float32, kernels).train
    bf16 = plan_lib.make(config, ["/cpu:0"], tf.float32, kernels,
                         products=BFLOAT16).train
    self.assertEqual((f32.lstm.forward, f32.lstm.backward),
                     (plan_lib.KERNELS, plan_lib.KERNELS))
    # The panels hold float32: bfloat16 products are tf.matmul's; the cell
    # and the softmax loss, float32, stay on the kernels.
    self.assertEqual((bf16.lstm.forward, bf16.lstm.backward),
                     (plan_lib.MATMUL, plan_lib.TRANSPOSED))
    self.assertEqual((bf16.lstm.cell, bf16.softmax.loss, bf16.lstm.isa),
                     (plan_lib.FUSED_CELL, plan_lib.KERNEL, "avx512"))
    self.assertEqual((bf16.lstm.products, bf16.softmax.products),
                     (BFLOAT16, BFLOAT16))
    self.assertEqual(plan_lib.fields(plan_lib.Plan(kernels, bf16))[
        "products"], "bfloat16")


def printed_plan(err):
  """The fields of the plan line on stderr, and the kernels' and the
  plan's whys."""
  (line,) = [l for l in err.splitlines() if l.startswith("Plan: ")]
  why = re.search(r"^Plan: kernels=\S+ \((.*?)\) ", line).group(1)
  plan_why = re.search(r" plan=\w+ \((.*)\)$", line).group(1)
  line = line.replace(" (%s)" % why, "", 1).replace(" (%s)" % plan_why, "")
  return dict(re.findall(r"(\w+)=(\S+)", line)), why, plan_why


def assert_recorded(test, recorded, fields, why, plan_why):
  """The summary JSON's plan is the printed one (printed_plan's)."""
  recorded = dict(recorded)
  test.assertEqual(recorded.pop("kernels_why"), why)
  test.assertEqual(recorded.pop("plan_why"), plan_why)
  test.assertEqual(recorded, fields)


def _ops(graph, scope, op_type, backward=None):
  """`scope`'s ops of `op_type`; of its backward pass only, or none of it."""
  return [op for op in graph.get_operations()
          if op.type == op_type and op.name.startswith(scope + "/") and
          backward in (None, "/gradients/" in op.name)]


def _swaps(graph):
  """The training step's swapped products: a Transpose of a MatMul."""
  return [op for op in _ops(graph, "Train", "Transpose", True)
          if op.inputs[0].op.type == "MatMul"]


def assert_graph_follows(test, graph, fields, layers, steps):
  """The graph of main's three models does what the printed plan says.

  Args:
    test: the TestCase.
    graph: the graph main built.
    fields: the printed plan's fields.
    layers, steps: the config's layers, and the steps of a training call.
  """
  wavefront = fields["lstm"].split(",")[0] == plan_lib.WAVEFRONT
  test.assertLen(fields["lstm"].split(","), layers)
  for scope, recurrent in (("Train", fields["recurrent"]),
                           ("Valid", fields["recurrent_valid"]),
                           ("Test", fields["recurrent_test"])):
    count = lambda op_type, backward=False: len(  # pylint: disable=cell-var-from-loop
        _ops(graph, scope, op_type, backward))
    # One custom gradient for the wavefront's layers, or one per layer; one
    # for the softmax layer.
    test.assertEqual(count("IdentityN"), (1 if wavefront else layers) + 1,
                     msg=scope)
    test.assertEqual(count("LstmCell") > 0, fields["cell"] == "LstmCell",
                     msg=scope)
    test.assertEqual(count("BlockLSTM"),
                     layers if fields["cell"] == "BlockLSTM" else 0, msg=scope)
    test.assertEqual(count("PanelMatMul") > 0, recurrent == "kernels",
                     msg=scope)
    test.assertEqual(count("SoftmaxCrossEntropy"),
                     int(fields["softmax"] == "kernel"), msg=scope)
    test.assertEqual(count("InplaceSub"), int(fields["softmax"] == "ops"),
                     msg=scope)
  backward = lambda op_type: len(_ops(graph, "Train", op_type, True))
  test.assertEqual(backward("PanelMatMul") > 0,
                   fields["backward"] == "kernels")
  test.assertEqual(backward("Snapshot"),
                   layers if fields["backward"] == "transposed" else 0)
  test.assertEqual(len(_ops(graph, "Train", "ApplyOuterProduct")),
                   layers + 2 if fields["updates"] == "factors" else 0)
  swapped = {}
  for name in fields["swapped"].split(","):
    what, _, part = name.partition(":")
    swapped[what] = int(part.split("/")[0]) if part else None
  blocks = -(-steps // int(fields["chunk"])) if wavefront else 1
  want = ((1 if "softmax" in swapped else 0) +
          layers * (swapped["inputs"] or blocks if "inputs" in swapped
                    else 0) +
          layers * steps * ("recurrent" in swapped))
  test.assertLen(_swaps(graph), want)
  isas = {op.get_attr("isa").decode() for op in graph.get_operations()
          if op.type in ("PanelMatMul", "LstmCell", "SoftmaxCrossEntropy",
                         "ApplyOuterProduct")}
  test.assertEqual(isas, set() if fields["kernels"] == "none"
                   else {fields["kernels"]})


class PlanRanTest(tf.test.TestCase):
  """main prints its plan and records it, and its graph follows it.

  Built, not trained: run_epoch is a stand-in that returns at once.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._tmp = tempfile.TemporaryDirectory()
    cls.data = testing.make_corpus(cls._tmp.name)

  @classmethod
  def tearDownClass(cls):
    cls._tmp.cleanup()
    super().tearDownClass()

  def _run(self, mode, overrides, environ=None, plan_flags=("--plan=estimate",)):
    """main's stderr line, its summary's plan, its graph, in this process
    (by the rules unless `plan_flags` say otherwise)."""
    graphs = []
    real_build_models = ptb_word_lm.build_models

    def build_models(*args, **kwargs):
      graphs.append(tf.compat.v1.get_default_graph())
      return real_build_models(*args, **kwargs)

    summary = os.path.join(self._tmp.name, "summary.json")
    kernel_offer.forget_offered()
    self.addCleanup(kernel_offer.forget_offered)
    with mock.patch.dict(os.environ, environ or {}), mock.patch.object(
        ptb_word_lm, "build_models", build_models):
      _, err, stop = run_in_process(
          ["--data_path=" + self.data, "--model=test", "--num_gpus=0",
           "--rnn_mode=" + mode, "--summary_json=" + summary,
           "--config_overrides=vocab_size=100," + overrides,
           *plan_flags],
          run_epoch=lambda *args, **kwargs: 1.0)
    self.assertIsNone(stop, err)
    with open(summary) as f:
      recorded = json.load(f)["plan"]
    return printed_plan(err), recorded, graphs[0]

  def _check(self, mode, overrides, layers, steps, environ=None, want=None):
    (fields, why, plan_why), recorded, graph = self._run(mode, overrides,
                                                         environ)
    assert_recorded(self, recorded, fields, why, plan_why)
    self.assertEqual((fields["plan"], plan_why),
                     ("estimate", "the rules of ptb/plan.py"))
    for key, value in (want or {}).items():
      self.assertEqual(fields[key], value, msg=key)
    assert_graph_follows(self, graph, fields, layers, steps)
    return fields

  def testTheTestModel(self):
    # 40 rows: the updates from factors where the kernels run.
    self._check("basic", "num_layers=2", 2, 2,
                want={"lstm": "wavefront,wavefront", "chunk": "4"})

  def testMainMeasuresByDefaultButNotTinySteps(self):
    (fields, why, plan_why), recorded, _ = self._run("basic", "num_layers=1",
                                                     plan_flags=())
    assert_recorded(self, recorded, fields, why, plan_why)
    self.assertEqual(fields["plan"], "measure")
    self.assertIn("too small to time, the rules kept", plan_why)

  def testRecurrentKernelsAndTheFusedCellLayerByLayer(self):
    fields = self._check(
        "block", "hidden_size=1024,num_steps=8,batch_size=8", 1, 8,
        want={"lstm": "layer", "cell": "LstmCell"}
        if plan_lib.offered().isa else {"lstm": "BlockLSTM"})
    self.assertEqual(fields["recurrent"] == "kernels",
                     plan_lib.offered().isa is not None)

  def testSwappedProducts(self):
    # 8 x 4 rows against a [512, 2048] weight; 4 steps: too few to pack.
    self._check("basic", "hidden_size=512,num_steps=4,batch_size=8", 1, 4,
                want={"recurrent": "matmul", "backward": "swapped",
                      "swapped": "inputs,recurrent"})

  def testWithoutKernelsTheTensorFlowOpsPath(self):
    self._check("block", "num_layers=2", 2, 2,
                environ={"PTB_LSTM_KERNELS": "0"},
                want={"kernels": "none", "lstm": "BlockLSTM,BlockLSTM",
                      "softmax": "ops", "updates": "dense"})


if __name__ == "__main__":
  tf.test.main()
