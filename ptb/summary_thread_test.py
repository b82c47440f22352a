"""Tests of ptb/summary_thread.py: the windows the original's thread took."""

import os
import shutil
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import summary_thread
from ptb import tensorboard
from ptb.errors import UserError
import reader


class WindowTakerTest(tf.test.TestCase):

  def testTakesOneWindowOfEachInputAtTheStartAndEveryInterval(self):
    data = np.arange(200)
    with tf.Graph().as_default():
      train = reader.producer(data, 4, 5, name="Train")
      valid = reader.producer(data, 2, 5, name="Valid")
      taker = summary_thread.WindowTaker(120.0, [train, valid])
      with self.session() as session:
        session.run(tf.compat.v1.local_variables_initializer())
        clock = mock.patch("time.time")
        with clock as now:
          for seconds, expected in ((1000.0, 1), (1119.0, 1), (1120.0, 2),
                                    (1200.0, 2), (1250.0, 3)):
            now.return_value = seconds
            taker(session)
            self.assertEqual(session.run([train.position, valid.position]),
                             [expected, expected], seconds)
        # The next window served is the one after those taken.
        self.assertAllEqual(session.run(train.x)[0], data[15:20])

  def testTakesAtTheListedCallsOnlyAsOftenAsListed(self):
    data = np.arange(400)
    with tf.Graph().as_default():
      train = reader.producer(data, 4, 5, name="Train")
      valid = reader.producer(data, 2, 5, name="Valid")
      taker = summary_thread.WindowTaker(0.0, [train, valid], [0, 3, 3, 7])
      with self.session() as session:
        session.run(tf.compat.v1.local_variables_initializer())
        positions = []
        for _ in range(9):  # before the first call, then after 8 calls
          taker(session)
          positions.append(session.run(train.position))
        self.assertEqual(positions, [1, 1, 1, 3, 3, 3, 3, 4, 4])
        self.assertEqual(session.run(valid.position), 4)

  def testRefusesSeveralValidationWindowsACallAndBothWays(self):
    summary_thread.check(0.0, 4)
    summary_thread.check(120.0, 1)
    self.assertEqual(summary_thread.check(0.0, 1, ["7", "0", "7"]),
                     [0, 7, 7])
    with self.assertRaisesRegex(UserError, "give --eval_unroll=1"):
      summary_thread.check(120.0, 2)
    with self.assertRaisesRegex(UserError, "give --eval_unroll=1"):
      summary_thread.check(0.0, 2, ["3"])
    with self.assertRaisesRegex(UserError, "give one of"):
      summary_thread.check(120.0, 1, ["3"])
    for bad in (["-1"], ["x"], ["2", ""]):
      with self.assertRaisesRegex(UserError, r"integers >= 0\), not"):
        summary_thread.check(0.0, 1, bad)


class TakesTest(tf.test.TestCase):

  def testTakesReadFromTheSummariesOfTrainingLoss(self):
    directory = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, directory)
    writer = tensorboard.ScalarWriter(directory)
    with mock.patch("time.time") as now:
      for step, when, tag in ((0, 100.0, "Train/Training_Loss"),
                              (5, 150.0, "Model/global_step/sec"),
                              (12, 220.0, "Train/Training_Loss"),
                              (9, 210.0, "Train/Training_Loss")):
        now.return_value = when
        writer.add(step, {tag: 1.0, "Valid/Validation_Loss": 2.0})
    writer.close()
    self.assertEqual(summary_thread.takes_in_events(directory),
                     [(0, 100.0), (9, 210.0), (12, 220.0)])
    os.remove(writer.path)
    self.assertEqual(summary_thread.takes_in_events(directory), [])

  def testCallsOfTakes(self):
    # Passes of 10 training and 4 validation calls; epoch lines printed at
    # these times.
    times = {("train", 1): 100.0, ("valid", 1): 120.0,
             ("train", 2): 220.0, ("valid", 2): 240.0}
    takes = [(0, 0.0),      # as the session opened: before the first call
             (3, 50.0),     # during training call 4: after it
             (9, 95.0),     # during the last training call of epoch 1
             (10, 104.0),   # a quarter into epoch 1's validation: call 1
             (10, 116.0),   # 0.8 into it: its call 4 of 4
             (10, 125.0),   # after it: epoch 2's first call
             (12, 150.0)]   # epoch 2's training call 3
    self.assertEqual(
        summary_thread.calls_of_takes(takes, 10, 4, times),
        [0, 4, 10, 11, 14, 15, 17])


if __name__ == "__main__":
  tf.test.main()
