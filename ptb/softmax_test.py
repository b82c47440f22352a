"""Tests of the softmax layer's loss and its hand-written gradient."""

import itertools

import numpy as np
import tensorflow as tf

from ptb import plan as plan_lib
from ptb import softmax

# The path of TensorFlow's ops (GPUs, float16, no kernels): the one that
# writes p - onehot into the probabilities' buffer (InplaceSub).
OPS = plan_lib.Softmax(plan_lib.OPS, plan_lib.PLAIN, None)


def _paths():
  """The softmax layer's paths here: TensorFlow's ops, the kernel's too."""
  isa = plan_lib.offered().isa
  kernel = plan_lib.Softmax(plan_lib.KERNEL, plan_lib.PLAIN, isa)
  # The kernel's path where it can run (kernels_test compares the two
  # paths directly too).
  return [OPS] + ([kernel] if isa else [])


class SoftmaxLossTest(tf.test.TestCase):

  def _check(self, inputs, w, b, labels, d_loss):
    """Both paths of softmax_loss against TensorFlow's; their losses."""
    losses = []
    for plan in _paths():
      with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        args = [tf.constant(v) for v in (inputs, w, b)]
        ours = softmax.softmax_loss(plan, *args, tf.constant(labels))
        theirs = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(args[0], args[1]) + args[2])
        grads = [tf.compat.v1.gradients(loss * d_loss, args)
                 for loss in (ours, theirs)]
        got, want, g_got, g_want = sess.run([ours, theirs] + grads)
      self.assertAllClose(got, want, rtol=1e-6, atol=1e-5, msg=plan.loss)
      for g, w_ in zip(g_got, g_want):
        self.assertAllClose(g, w_, rtol=1e-5, atol=1e-6, msg=plan.loss)
      losses.append(got)
    return losses

  def testMatchesTensorFlowLossAndGradients(self):
    rng = np.random.RandomState(4)
    inputs = rng.uniform(-3, 3, size=(7, 5)).astype(np.float32)
    w = rng.uniform(-2, 2, size=(5, 11)).astype(np.float32)
    b = rng.uniform(-1, 1, size=11).astype(np.float32)
    labels = rng.randint(0, 11, size=7).astype(np.int32)
    d_loss = rng.uniform(0, 2, size=7).astype(np.float32)
    self._check(inputs, w, b, labels, d_loss)

  def testTargetProbabilityBelowFloatRangeGivesTheExactLoss(self):
    # Row 1's target logit is 200 below the others: its probability, e^-200,
    # is 0 in float32, and -log(p) would be inf. The loss must be 200.
    inputs = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    w = np.array([[0.5, 0.0, 0.0], [0.0, 0.0, -200.0]], np.float32)
    b = np.zeros(3, np.float32)
    labels = np.array([0, 2], np.int32)
    for got in self._check(inputs, w, b, labels, np.ones(2, np.float32)):
      self.assertAllClose(got[1], 200.0 + np.log(2.0), rtol=1e-6)
      self.assertAllClose(
          got[0], np.log(np.exp(0.5) + 2.0) - 0.5, rtol=1e-6)


class InPlaceTest(tf.test.TestCase):
  """p - onehot is written over the probabilities, once, and safely."""

  def testEveryGradientTakenReadsTheRightNumbers(self):
    # Three gradients of the loss, run together, as the optimizer's and a
    # global norm's would be: each must see p - onehot subtracted once.
    # Also without Grappler, which may merge identical in-place ops.
    rng = np.random.RandomState(8)
    values = [rng.uniform(-2, 2, s).astype(np.float32)
              for s in ((6, 4), (4, 9), (9,))]
    labels = rng.randint(0, 9, 6).astype(np.int32)
    weights = [rng.uniform(0.5, 2, 6).astype(np.float32) for _ in range(3)]
    plain = tf.compat.v1.ConfigProto()
    plain.graph_options.rewrite_options.disable_meta_optimizer = True
    for plan, config in itertools.product(_paths(), (None, plain)):
      with self.subTest(loss=plan.loss, grappler=config is None), \
          tf.Graph().as_default(), \
          tf.compat.v1.Session(config=config) as sess:
        args = [tf.constant(v) for v in values]
        ours = softmax.softmax_loss(plan, *args, tf.constant(labels))
        theirs = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=tf.matmul(args[0], args[1]) + args[2])
        got, want = sess.run(
            [[tf.compat.v1.gradients(ours * d, args) for d in weights],
             [tf.compat.v1.gradients(theirs * d, args) for d in weights]])
        for k, (g, w) in enumerate(zip(got, want)):
          for name, g_, w_ in zip(("inputs", "w", "b"), g, w):
            self.assertAllClose(g_, w_, rtol=1e-5, atol=1e-6,
                                msg="gradient %d, %s" % (k, name))

  def testTheProbabilitiesHaveNoOtherReader(self):
    # Their buffer is overwritten: besides the target's gather, their one
    # reader is the in-place op, however many gradients are taken.
    with tf.Graph().as_default() as graph:
      args = [tf.ones([6, 4]), tf.ones([4, 9]), tf.zeros([9])]
      loss = softmax.softmax_loss(OPS, *args, tf.zeros([6], tf.int32))
      for _ in range(2):
        tf.compat.v1.gradients(loss, args)
      (probs,) = [op.outputs[0] for op in graph.get_operations()
                  if op.type == "Softmax"]
      self.assertCountEqual([op.type for op in probs.consumers()],
                            ["GatherNd", "Reshape"])
      (reshape,) = [op for op in probs.consumers() if op.type == "Reshape"]
      self.assertEqual([op.type for op in reshape.outputs[0].consumers()],
                       ["InplaceSub"])
      self.assertLen([op for op in graph.get_operations()
                      if op.type == "InplaceSub"], 1)


if __name__ == "__main__":
  tf.test.main()
