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

The takes come at times, so a program of another speed takes other
windows. `takes_in_events` reads when the original's took theirs (its
summaries, with the global step, in its --save_path's event files) and
`calls_of_takes` turns them into the port's session calls, which
--original_summary_calls replays: compare_original.py does so.
"""

import collections
import glob
import math
import os
import time

import tensorflow as tf

from ptb.errors import UserError


# The summary that each take of the original's thread wrote.
_TAKE_TAG = "Train/Training_Loss"


def check(every_secs, validation_windows_per_call, at_calls=()):
  """Refuses a take with several validation windows a call, and both ways.

  A call of the validation input must be one window for one to be skipped.

  Returns:
    --original_summary_calls as sorted ints (one per take).
  """
  try:
    calls = sorted(int(c) for c in at_calls or ())
  except ValueError:
    calls = [-1]
  if min(calls, default=0) < 0:
    raise UserError("--original_summary_calls takes session-call counts "
                    "(integers >= 0), not %s" % ",".join(at_calls),
                    exit_code=2)
  if every_secs and calls:
    raise UserError("give one of --original_summary_secs (takes every so "
                    "many seconds) and --original_summary_calls (takes at "
                    "those calls)", exit_code=2)
  if (every_secs or calls) and validation_windows_per_call > 1:
    raise UserError("--original_summary_%s skips single windows: give "
                    "--eval_unroll=1 (validation then takes one window a "
                    "call, as the original did)" % (
                        "secs" if every_secs else "calls"), exit_code=2)
  return calls


def takes_in_events(directory):
  """The original's takes: [(global step, wall time)] in time order (eager).

  Args:
    directory: its --save_path, where its Supervisor wrote event files.
  """
  takes = []
  for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      event = tf.compat.v1.Event.FromString(record)
      if any(v.tag == _TAKE_TAG for v in event.summary.value):
        takes.append((event.step, event.wall_time))
  return sorted(takes, key=lambda take: take[1])


def calls_of_takes(takes, train_calls, valid_calls, line_times):
  """The port's session-call counts after which the original took windows.

  A take that recorded global step g came while the training call g + 1
  was running (its window already dequeued, the step not yet counted; the
  gap between two calls is short) and took the window after it: the port
  takes after that call. The first take, as the session opened, comes
  before the first call. A take at an epoch's last step came in that
  epoch's validation pass, placed by its time between the pass's two
  printed lines, or else in the next epoch's first call.

  Args:
    takes: takes_in_events' list, from a run that started at step 0.
    train_calls, valid_calls: calls of a training and a validation pass.
    line_times: {("train" | "valid", epoch): wall time of the original's
      epoch line}.

  Returns:
    Sorted call counts (0: before the first call), one per take.
  """
  per_epoch = train_calls + valid_calls
  calls = []
  for i, (step, when) in enumerate(takes):
    epochs, into = divmod(step, train_calls)
    if i == 0 and step == 0:
      calls.append(0)
    elif into:
      calls.append(epochs * per_epoch + into + 1)
    else:
      begun = line_times.get(("train", epochs))
      ended = line_times.get(("valid", epochs))
      if begun is None or ended is None or when > ended:
        calls.append(epochs * per_epoch + 1)
      else:
        share = max(0.0, when - begun) / max(ended - begun, 1e-9)
        call = min(valid_calls, max(1, math.ceil(share * valid_calls)))
        calls.append((epochs - 1) * per_epoch + train_calls + call)
  return sorted(calls)


class WindowTaker(object):
  """Takes one window of each input when the original's thread would have.

  Called before a run's first session call and after every call; each time
  at least `every_secs` have passed since the last take (the first call
  always takes), or where the calls made so far are in `at_calls` (once
  for each time they are listed), every input's position moves on by one
  call. With neither it takes nothing.
  """

  def __init__(self, every_secs, inputs, at_calls=()):
    """Builds the op; `inputs` are PTBInputs of one window a call."""
    self._every = every_secs
    self._next = None
    self._at = collections.Counter(at_calls) if at_calls else None
    self._calls = 0
    self._take = (tf.group(*[i.position.assign_add(1) for i in inputs])
                  if every_secs or at_calls else None)

  def __call__(self, session):
    if self._take is None:
      return
    if self._at is not None:
      for _ in range(self._at.pop(self._calls, 0)):
        session.run(self._take)
      self._calls += 1
      return
    now = time.time()
    if self._next is None:
      self._next = now
    if now >= self._next:
      session.run(self._take)
      self._next += self._every
