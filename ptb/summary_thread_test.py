"""Tests of ptb/summary_thread.py: the windows the original's thread took."""

from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import summary_thread
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

  def testRefusesSeveralValidationWindowsACall(self):
    summary_thread.check(0.0, 4)
    summary_thread.check(120.0, 1)
    with self.assertRaisesRegex(UserError, "give --eval_unroll=1"):
      summary_thread.check(120.0, 2)


if __name__ == "__main__":
  tf.test.main()
