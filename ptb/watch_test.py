"""Tests of ptb/watch.py: what happens after every session call.

The Watch runs here on recorded calls, with a stand-in for the run's
checkpoints; the real runs, signals and saves are in training_test.py,
resume_test.py and outputs_test.py.
"""

import signal
import types
from unittest import mock

import tensorflow as tf

from ptb import monitor
from ptb import watch as watch_lib
from ptb.errors import Stop
from ptb.errors import UserError


class FakeRunState(object):
  """training.RunState' part that a Watch uses; records the saves."""

  def __init__(self, save_path=None):
    self.save_path = save_path
    self.saving = bool(save_path)
    self.save_failure = None
    self.saves = []
    self.confirmed = 0  # calls that confirmed the last save's weights

  def confirm(self):
    self.confirmed += 1

  def diverged(self, what):
    return UserError("training diverged %s" % what)

  def save(self, session, epoch, step, costs):
    self.saves.append((epoch, step, costs))
    return "%s/model.ckpt-%d" % (self.save_path, step)

  def save_and_go_on(self, session, epoch, step, costs):
    self.save(session, epoch, step, costs)

  def finish(self, session):
    self.saves.append("finish")
    return "%s/model.ckpt-end" % self.save_path


# A training pass of 10 calls of 4 rows, 2 towers and 5 steps.
TRAIN_INPUT = types.SimpleNamespace(num_calls=10, batch_size=4, num_towers=2,
                                    num_steps=5)


class WatchTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    patcher = mock.patch.object(monitor, "release_library_pages")
    self.release = patcher.start()
    self.addCleanup(patcher.stop)
    self.signals = types.SimpleNamespace(signum=None)

  def watch(self, checkpoints, save_every_steps=0, cluster=None):
    return watch_lib.Watch("session", self.signals, checkpoints, TRAIN_INPUT,
                           save_every_steps=save_every_steps, cluster=cluster)

  def testWhereFollowsThePasses(self):
    watch = self.watch(FakeRunState())
    self.assertEqual(watch.where, watch_lib.Where())
    on_step = watch.begin("train", 2, start=(4, 10.0))
    self.assertEqual(watch.where, watch_lib.Where("train", 2, 0, 10.0))
    for step in range(4, 10):
      on_step(step, 1.0, 10.0 + step - 3)
    self.assertEqual(watch.where, watch_lib.Where("train", 2, 9, 16.0))
    watch.begin("valid", 2)
    # The training pass's summed cost, for a save in the valid pass.
    self.assertEqual(watch.where, watch_lib.Where("valid", 2, 0, 0.0, 16.0))

  def testLibraryPagesAfterEachPhasesFirstCall(self):
    watch = self.watch(FakeRunState())
    for epoch in (1, 2):
      for phase in ("train", "valid"):
        on_step = watch.begin(phase, epoch)
        on_step(0, 1.0, 1.0)
        on_step(1, 1.0, 2.0)
    self.assertEqual(self.release.call_count, 2)

  def testTrainingSpeedIsOfTheCallsOfThisProcess(self):
    watch = self.watch(FakeRunState())
    # The clock at the pass's start, then after each call.
    with mock.patch.object(watch_lib.time, "time",
                           side_effect=[100.0, 100.5, 101.0, 101.5, 102.0]):
      on_step = watch.begin("train", 1, start=(6, 3.0))
      for step in range(6, 10):
        on_step(step, 1.0, 3.0 + step)
    self.assertEqual(watch.seconds("train"), 2.0)
    # Calls 6 to 9, each of 4 rows in each of 2 towers, of 5 words.
    self.assertEqual(watch.train_calls(), 4)
    self.assertEqual(watch.train_wps(), 4 * 4 * 2 * 5 / 2.0)

  def testAPassResumedAfterItsLastCallHasNoSpeed(self):
    # A run stopped in the valid pass resumes its training pass at the end.
    watch = self.watch(FakeRunState())
    with mock.patch.object(watch_lib.time, "time", return_value=100.0):
      watch.begin("train", 1, start=(10, 30.0))
    self.assertEqual(watch.train_calls(), 0)
    self.assertIsNone(watch.train_wps())

  def testADivergedCostStopsAndASoundOneConfirms(self):
    checkpoints = FakeRunState()
    watch = self.watch(checkpoints)
    on_step = watch.begin("train", 3)
    # 5 steps a call: up to 1000 nats a word is sound, above has diverged.
    on_step(0, 5000.0, 5000.0)
    self.assertEqual(checkpoints.confirmed, 1)
    for cost in (float("nan"), float("inf"), 5000.5):
      with self.assertRaisesRegex(
          UserError, r"^training diverged at epoch 3 step 2: the cost is "
          r"%s$" % cost):
        on_step(1, cost, cost)
    self.assertEqual(checkpoints.confirmed, 1)
    # Validation and test costs are not the training's: they neither stop
    # nor confirm.
    watch.begin("valid", 3)(0, float("inf"), float("inf"))
    self.assertEqual(checkpoints.confirmed, 1)

  def testSavesEveryStepsOfTraining(self):
    checkpoints = FakeRunState("S")
    watch = self.watch(checkpoints, save_every_steps=4)
    on_step = watch.begin("train", 2)
    for step in range(10):
      on_step(step, 1.0, step + 1.0)
    on_step = watch.begin("valid", 2)
    for step in range(10):
      on_step(step, 1.0, step + 1.0)
    self.assertEqual(checkpoints.saves, [(1, 4, 4.0), (1, 8, 8.0)])

  def testASignalSavesWhereTheRunResumes(self):
    checkpoints = FakeRunState("S")
    watch = self.watch(checkpoints)
    on_step = watch.begin("train", 1)
    on_step(0, 1.0, 1.0)
    self.signals.signum = signal.SIGTERM
    with self.assertRaises(Stop) as e:
      on_step(1, 1.0, 2.0)
    self.assertEqual(str(e.exception), "interrupted by SIGTERM in the train "
                     "pass of epoch 1 at step 1 (checkpoint saved to "
                     "S/model.ckpt-2); run the same command to resume")
    self.assertEqual(e.exception.exit_code, 143)
    self.signals.signum = None
    watch.begin("valid", 1)(0, 1.0, 1.0)
    self.signals.signum = signal.SIGINT
    with self.assertRaises(Stop) as e:
      watch.on_step(1, 1.0, 2.0)
    self.assertEqual(e.exception.exit_code, 130)
    # After the valid pass, the checkpoint holds the whole training pass.
    self.assertEqual(checkpoints.saves, [(0, 2, 2.0), (0, 10, 2.0)])
    # In the test pass, the run's end: the last epoch's (RunState.finish).
    self.signals.signum = signal.SIGTERM
    with self.assertRaises(Stop) as e:
      watch.begin("test", 1)(0, 1.0, 1.0)
    self.assertEqual(str(e.exception), "interrupted by SIGTERM in the test "
                     "pass of epoch 1 at step 0 (checkpoint saved to "
                     "S/model.ckpt-end); run the same command to resume")
    self.assertEqual(checkpoints.saves[-1], "finish")

  def testASignalWithoutSavePathSaysThatNothingIsSaved(self):
    self.signals.signum = signal.SIGINT
    with self.assertRaisesRegex(
        Stop, r"^interrupted by SIGINT in the test pass of epoch 4 at step 0 "
        r"\(nothing saved: without --save_path a run cannot be resumed; add "
        r"--save_path=DIR to make the next run resumable\)$"):
      self.watch(FakeRunState()).begin("test", 4)(0, 1.0, 1.0)


if __name__ == "__main__":
  tf.test.main()
