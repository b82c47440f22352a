"""Tests of run_local_cluster.py's command line.

Its clusters are tested in ptb/cluster_test.py.
"""

import functools
from unittest import mock

import tensorflow as tf

from ptb import errors
from ptb import testing
import run_local_cluster


class RefusedCommandLineTest(tf.test.TestCase):
  """Bad flags end in one line before any task starts."""

  def _run(self, args):
    """The launcher's entry point on `args`; starting a task fails."""
    with mock.patch.object(run_local_cluster, "launch") as launch:
      result = testing.run_entry_point(
          functools.partial(errors.run_main, run_local_cluster.main,
                            graph_mode=False),
          ["run_local_cluster.py"] + args)
    self.assertFalse(launch.called, "a task started first")
    return result

  def testEachEndsInOneLineBeforeAnyTaskStarts(self):
    testing.assert_each_refused(self, "run_local_cluster.py", [
        (["--num_ps=0"], "--num_ps=0 must be at least 1", 2),
        (["--num_workers=-1"], "--num_workers=-1 must be at least 1", 2),
        (["--grace=-5"], "--grace=-5.0 must be 0 or more", 2),
        (["--grace=nan"], "--grace=nan must be 0 or more", 2),
        (["--num_workers=two"], "flag --num_workers=two: invalid literal", 2),
        (["--", "--model=test", "--job_name=ps"],
         "--job_name=ps: the launcher sets --job_name for each task", 2),
        (["--", "--task_index", "1"],
         "the launcher sets --task_index for each task", 2),
    ], self._run)
    # One as a program: the real entry point, with only the launcher's
    # flags defined (in this process, other test files may have defined
    # ptb_word_lm.py's), where they belong after "--".
    testing.assert_error_line(
        self, "run_local_cluster.py",
        testing.run_program("run_local_cluster.py", ["--model=test"]),
        "Unknown command line flag 'model'", 2)


if __name__ == "__main__":
  tf.test.main()
