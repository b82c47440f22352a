"""Tests of ptb/profile.py: the parts of a step and their shares."""

import tensorflow as tf

from ptb import profile

DIMS = {"batch": 20, "hidden": 1500, "vocab": 10000}


class PartTest(tf.test.TestCase):

  def testEachOpItsPart(self):
    for op, shapes, name, want in (
        ("_MklMatMul", [[700, 1500], [1500, 10000], [700, 10000]],
         "Train/Model/tower_0/MatMul", "softmax products"),
        ("_MklMatMul", [[1500, 700], [700, 10000], [1500, 10000]],
         "Train/Model/gradients/MatMul_1", "softmax products"),
        ("PanelMatMul", [[20, 1500], [188, 1500, 32], [20, 6000],
                         [20, 6000]], "Train/Model/tower_0/l0/PanelMatMul_3",
         "recurrent products"),
        ("PanelMatMulBf16", [[20, 6000], [47, 3000, 32], [20, 1500],
                             [20, 1500]], "Train/gradients/x",
         "recurrent products"),
        ("_MklMatMul", [[700, 1500], [1500, 6000], [700, 6000]],
         "Train/Model/tower_0/MatMul_2", "input products"),
        ("_MklMatMul", [[700, 3000], [700, 6000], [3000, 6000]],
         "Train/Model/gradients/MatMul_4", "gradient products"),
        ("LSTMBlockCellGrad", [], "Train/gradients/c", "cell"),
        ("Sigmoid", [], "Train/Model/tower_0/Sigmoid", "cell"),
        ("SoftmaxCrossEntropy", [], "Train/Model/tower_0/s", "softmax loss"),
        ("L2Loss", [], "Train/Model/global_norm/L2Loss", "update"),
        ("Mul", [], "Train/Model/GradientDescent/mul", "update"),
        ("ApplyOuterProduct", [], "Train/Model/a", "update"),
        ("Cast", [], "Train/Model/tower_0/Cast", "casts and packing"),
        ("PackPanelsBf16", [], "Train/Model/tower_0/P", "casts and packing"),
        ("StridedSlice", [], "Train/Model/tower_0/s", "other")):
      with self.subTest(op=op, name=name):
        self.assertEqual(profile.part(op, shapes, DIMS, name), want)


class SharesTest(tf.test.TestCase):

  def testWallTimeSharedAmongTheOpsRunningAtEachInstant(self):
    # 0-2 s: cell alone; 2-3 s: cell and update; 3-4 s: update alone; a
    # gap; 5-6 s: other.
    seconds, busy, span = profile.shares([
        (0.0, 3.0, "cell"), (2.0, 4.0, "update"), (5.0, 6.0, "other")])
    self.assertAllClose(seconds["cell"], 2.5)
    self.assertAllClose(seconds["update"], 1.5)
    self.assertAllClose(seconds["other"], 1.0)
    self.assertEqual(seconds["input products"], 0.0)
    self.assertAllClose(busy, 5.0)
    self.assertAllClose(span, 6.0)
    self.assertAllClose(sum(seconds.values()), busy)
    self.assertEqual(list(seconds), list(profile.PARTS))

  def testLineGivesEachPartsShareOfTheStep(self):
    seconds = dict.fromkeys(profile.PARTS, 0.0)
    seconds.update(cell=0.25, update=0.5)
    self.assertEqual(
        profile.line(seconds, 0.75, 1.0),
        "profile: cell 25.0%, update 50.0%; the parts add up to 0.750 s of "
        "the traced step's 1.000 s")


if __name__ == "__main__":
  tf.test.main()
