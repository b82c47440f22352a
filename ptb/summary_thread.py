"""The windows that the original's summary thread took from its inputs.

Given a --save_path, the original's tf.train.Supervisor started a thread
that evaluated the graph's summaries as the session opened and then every
120 s (its save_summaries_secs). Those summaries were the training and the
validation costs, so each evaluation dequeued the next window of both
input queues, which the passes then never trained or scored: as the queues
cycle over an epoch, each pass skipped the windows taken while it was
running or before it. (The test input was not summarised, and without a
--save_path no thread ran.) --original_summary_secs does the same here, by
moving the inputs' positions, so that a run can be set beside the
original's line by line.
"""

import time

import tensorflow as tf

from ptb.errors import UserError


def check(every_secs, validation_windows_per_call):
  """Refuses --original_summary_secs with several validation windows a call.

  A call of the validation input must be one window for one to be skipped.
  """
  if every_secs and validation_windows_per_call > 1:
    raise UserError("--original_summary_secs skips single windows: give "
                    "--eval_unroll=1 (validation then takes one window a "
                    "call, as the original did)", exit_code=2)


class WindowTaker(object):
  """Takes one window of each input when the original's thread would have.

  Called before a run's first session call and after every call; each time
  at least `every_secs` have passed since the last take (the first call
  always takes), every input's position moves on by one call. With
  `every_secs` 0 it takes nothing.
  """

  def __init__(self, every_secs, inputs):
    """Builds the op; `inputs` are PTBInputs of one window a call."""
    self._every = every_secs
    self._next = None
    self._take = (tf.group(*[i.position.assign_add(1) for i in inputs])
                  if every_secs else None)

  def __call__(self, session):
    if self._take is None:
      return
    now = time.time()
    if self._next is None:
      self._next = now
    if now >= self._next:
      session.run(self._take)
      self._next += self._every
