"""The perplexity lines of a run, read as it prints them.

compare_curves.py and compare_original.py run two programs that print the
tutorial's lines (`0.104 perplexity: 847.626 speed: 2237 wps`, `Epoch: 1
Train Perplexity: ...`, `Test Perplexity: ...`) and set them side by side.
"""

import re
import signal
import subprocess
import sys
import time

from ptb.errors import UserError

PROGRESS = re.compile(r"^(\d+\.\d{3}) perplexity: (\S+) speed: (\d+) wps$")
EPOCH = re.compile(r"^Epoch: (\d+) (Train|Valid) Perplexity: (\S+)$")
TEST = re.compile(r"^Test Perplexity: (\S+)$")


def run(name, command, fraction, env=None, echo=False, line_times=None,
        stop=signal.SIGTERM):
  """Runs `command`; returns its lines' values and the seconds it took.

  Args:
    name: the program's name in messages.
    command: its argv.
    fraction: stop it once it has printed the progress line of epoch 1 at
      or past this fraction; 0 lets it run to its end.
    env: its environment, or None for this one's.
    echo: copy its stdout to stderr as it comes (a long run shows life).
    line_times: None, or a dict to fill with {("train" | "valid", epoch):
      the wall time its epoch line came}.
    stop: the signal that stops it at `fraction` (SIGINT lets the
      original's Supervisor close its event files; it gets a minute, then
      SIGKILL).

  Returns:
    ({key: value}, seconds). Keys: ("train"|"valid", epoch) and ("test",)
    for the perplexities of epoch and test lines; ("progress", fraction
    text) and ("speed", fraction text) for the perplexity and wps of each
    progress line of epoch 1.

  Raises:
    UserError: the program failed (not stopped here).
  """
  print("Running %s: %s" % (name, " ".join(command)), file=sys.stderr,
        flush=True)
  start, found, epoch, stopped = time.time(), {}, 1, False
  proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
  for line in proc.stdout:
    if echo:
      print("  " + line, end="", file=sys.stderr, flush=True)
    line = line.strip()
    match = EPOCH.match(line)
    if match:
      epoch = int(match.group(1)) + (match.group(2) == "Valid")
      key = (match.group(2).lower(), int(match.group(1)))
      found[key] = float(match.group(3))
      if line_times is not None:
        line_times[key] = time.time()
    match = TEST.match(line)
    if match:
      found[("test",)] = float(match.group(1))
    match = PROGRESS.match(line)
    if match and epoch == 1:
      found[("progress", match.group(1))] = float(match.group(2))
      found[("speed", match.group(1))] = float(match.group(3))
      if fraction and float(match.group(1)) >= fraction:
        print("Stopping %s at %s of epoch 1 (%s)" % (
            name, match.group(1), signal.Signals(stop).name),
              file=sys.stderr, flush=True)
        proc.send_signal(stop)
        stopped = True
        break
  if stopped:
    proc.stdout.close()
  try:
    code = proc.wait(timeout=60 if stopped else None)
  except subprocess.TimeoutExpired:
    proc.kill()
    code = proc.wait()
  # A run stopped here ends with a status of its own; one that stopped by
  # itself and failed (a bad --model, say) ends the comparison.
  if code != 0 and not stopped:
    raise UserError("%s exited with status %d" % (name, code))
  return found, time.time() - start
