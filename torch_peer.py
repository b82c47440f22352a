#!/usr/bin/env python3
"""The PTB LSTM language model in PyTorch, the peer this port is measured by.

The tutorial's model and training (docs/model.md: the cost summed over the
steps, clipping to the global norm, plain SGD, the learning-rate schedule,
the state carried between windows), written for PyTorch on the CPU as a
PyTorch user would write it: `nn.LSTM`, whose layers run as oneDNN's fused
LSTM forward and backward. It reads the corpus with this project's reader,
found as ptb_word_lm.py finds it, and takes its config from ptb_word_lm.py's
source (`--model`, `--config_overrides`), so that a config class edited in
place drives both programs; neither brings TensorFlow into its process.
torch is not a requirement of the project:

  python3 -m pip install torch==2.13.0

Speed, the default: `--warmup` untimed training steps, then `--steps` timed
ones, on the training data; wps counts the words of the timed steps, as
benchmark.py does. It prints two lines, after `Config overrides: ...` when
there are some (peak_rss_mib is the peak over the training steps, warm-up
and timed, as benchmark.py measures it):

  python3 torch_peer.py --model=small --steps=60 --warmup=5
  model=small torch=V threads=T steps=60 seconds=S last_loss=L
      peak_rss_mib=M page_faults_per_step=F      (one line, folded here)
  wps: N

last_loss is the last step's cross-entropy per word; page_faults_per_step
counts the timed steps' page faults: with glibc malloc's defaults torch's
large gradients come back as fresh pages every step (docs/performance.md
tells how to make malloc keep them). A learning curve, with
`--epochs=N`: N epochs with the tutorial's learning-rate schedule, printing
ptb_word_lm.py's lines (`Epoch: 1 Learning rate: 1.000`, the progress
lines, `Epoch: 1 Train Perplexity: X`, `Epoch: 1 Valid Perplexity: X`),
then `Test Perplexity: X`. With `--save_path=DIR` the model is saved after
every epoch (DIR/torch_peer.pt), and the same command run again resumes
after the last saved epoch: a curve of many epochs need not run in one go.

With `--bf16`, in either mode, mixed precision as the shared peer
(../shared/bench/torch_peer.py) runs it: each window's forward pass and
cost, in training and evaluation, under torch.autocast("cpu",
dtype=torch.bfloat16), so the LSTM's and the softmax's products take
bfloat16 operands; the weights, their gradients and the update stay
float32. The speed line then reads `model=small bf16 torch=V ...`. oneDNN,
which runs nn.LSTM, builds a bfloat16 LSTM only on CPUs with the
instructions for it (AVX-512 ones, not AVX2 ones); elsewhere the run ends
before reading the corpus, with oneDNN's reason, where the shared peer's
first step ends in a traceback.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ptb import config as config_lib
from ptb import data as data_lib
from ptb import errors
from ptb import monitor
from ptb import outputs
from ptb.config import epoch_learning_rate
from ptb.errors import Stop
from ptb.errors import UserError
import reader

# The script whose config classes this peer trains (read, never imported).
CONFIG_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                             "ptb_word_lm.py")


class PTBModel(nn.Module):
  """The tutorial's network: embedding, stacked LSTM, softmax.

  Its parameters are the tutorial's variables in torch's layout
  (load_tutorial_weights maps one onto the other): the embedding
  `[vocab, hidden]`; per layer, the kernel `[2 * hidden, 4 * hidden]`
  transposed and split into `weight_ih` and `weight_hh` `[4 * hidden,
  hidden]`, with the gate blocks in torch's order (input, forget,
  candidate, output) for the tutorial's (input, candidate, forget,
  output), and the bias `[4 * hidden]` as `bias_ih`; the softmax
  `[hidden, vocab]` transposed, and its bias. torch's cell adds a second
  bias, `bias_hh`: here it is zero and frozen, so each gate has one bias as
  in the tutorial. No forget bias is added. The weights start as the
  tutorial's BASIC and BLOCK do: the LSTM biases at zero, every other
  parameter uniform in ±init_scale.

  In training, with keep_prob < 1, dropout acts on the embedded inputs and
  on every layer's output (nn.LSTM drops between its layers, this module
  after the top one), never on the recurrent state.
  """

  def __init__(self, config):
    super().__init__()
    size, layers = config.hidden_size, config.num_layers
    self.keep_prob = config.keep_prob
    self.embedding = nn.Embedding(config.vocab_size, size)
    self.lstm = nn.LSTM(size, size, layers,
                        dropout=1 - config.keep_prob if layers > 1 else 0)
    self.softmax = nn.Linear(size, config.vocab_size)
    for p in self.parameters():
      nn.init.uniform_(p, -config.init_scale, config.init_scale)
    for k in range(layers):
      nn.init.zeros_(getattr(self.lstm, "bias_ih_l%d" % k))
      bias_hh = getattr(self.lstm, "bias_hh_l%d" % k)
      nn.init.zeros_(bias_hh)
      bias_hh.requires_grad_(False)

  def zero_state(self, batch_size):
    """The state a pass starts from: (h, c), each `[layers, batch, hidden]`."""
    shape = (self.lstm.num_layers, batch_size, self.lstm.hidden_size)
    return torch.zeros(shape), torch.zeros(shape)

  def _dropout(self, x):
    if self.keep_prob < 1:
      return F.dropout(x, 1 - self.keep_prob, self.training)
    return x

  def forward(self, inputs, state):
    """Runs one window.

    Args:
      inputs: int64 `[steps, batch]` word ids.
      state: (h, c), each `[layers, batch, hidden]`.

    Returns:
      (logits `[steps * batch, vocab]`, the looked-up embeddings `[steps,
      batch, hidden]`, the final state).
    """
    embedded = self.embedding(inputs)
    outputs, state = self.lstm(self._dropout(embedded), state)
    logits = self.softmax(self._dropout(outputs))
    return logits.view(-1, logits.shape[-1]), embedded, state


def load_tutorial_weights(model, weights):
  """Sets `model`'s parameters from ptb_word_lm.py's variables.

  Args:
    model: a PTBModel.
    weights: {name: numpy array}: "Model/embedding" `[vocab, hidden]`;
      per layer k, "Model/RNN/cell_k/kernel" `[2 * hidden, 4 * hidden]`
      and "Model/RNN/cell_k/bias" `[4 * hidden]`, gates (i, j, f, o);
      "Model/softmax_w" `[hidden, vocab]`; "Model/softmax_b" `[vocab]`.
  """

  def torch_gates(a):
    """Puts the gate blocks of the last axis in torch's order."""
    i, j, f, o = np.split(a, 4, axis=-1)
    return torch.from_numpy(np.concatenate([i, f, j, o], axis=-1))

  size = model.lstm.hidden_size
  lstm = model.lstm
  with torch.no_grad():
    model.embedding.weight.copy_(torch.from_numpy(weights["Model/embedding"]))
    for k in range(lstm.num_layers):
      kernel = torch_gates(weights["Model/RNN/cell_%d/kernel" % k]).t()
      getattr(lstm, "weight_ih_l%d" % k).copy_(kernel[:, :size])
      getattr(lstm, "weight_hh_l%d" % k).copy_(kernel[:, size:])
      getattr(lstm, "bias_ih_l%d" % k).copy_(
          torch_gates(weights["Model/RNN/cell_%d/bias" % k]))
    model.softmax.weight.copy_(torch.from_numpy(weights["Model/softmax_w"]).t())
    model.softmax.bias.copy_(torch.from_numpy(weights["Model/softmax_b"]))


def windows(ids, batch_size, num_steps):
  """The windows of one pass over `ids`, as reader.py cuts them.

  Returns:
    (inputs, targets): int64 `[epoch_size, num_steps, batch_size]`, time
    major; window i's targets are its inputs shifted by one word.
  """
  x, y, _ = reader.chunk_windows(ids, batch_size, num_steps)
  return tuple(torch.from_numpy(np.ascontiguousarray(a.transpose(0, 2, 1),
                                                     np.int64))
               for a in (x, y))


def cost_of(model, inputs, targets, state, bf16=False):
  """The tutorial's cost of one window.

  Args:
    model: a PTBModel.
    inputs, targets: int64 `[steps, batch]`.
    state: the state to start from, (h, c) `[layers, batch, hidden]`.
    bf16: run the window under bfloat16 autocast (see the module's doc).

  Returns:
    (cost, embeddings, final state): the cost is the sum over the steps of
    the batch-averaged cross-entropy, a scalar tensor; the state float32.
  """
  # As the shared peer: the forward pass and the cost under autocast, the
  # logits back in float32 for the cross-entropy, whose log-sum-exp over
  # the vocabulary would lose the small probabilities in bfloat16. Autocast
  # leaves the embedding lookup float32; the LSTM's and the softmax's
  # products take bfloat16 operands.
  with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
    logits, embedded, state = model(inputs, state)
    cost = F.cross_entropy(logits.float(), targets.reshape(-1),
                           reduction="sum")
  # Under autocast the LSTM returns its state in bfloat16; the next window
  # starts from it in float32, as the shared peer's does (a no-op without).
  return cost / inputs.shape[1], embedded, tuple(s.float() for s in state)


def train_step(model, inputs, targets, state, lr, max_grad_norm,
               bf16=False):
  """One step of the tutorial's training on one window.

  The gradients are clipped to the global norm `max_grad_norm`, as
  tf.clip_by_global_norm does in the tutorial, and applied with plain SGD.

  Args:
    model: a PTBModel in training mode.
    inputs, targets: int64 `[steps, batch]`.
    state: the state to start from, (h, c) `[layers, batch, hidden]`.
    lr: the epoch's learning rate.
    max_grad_norm: the clipping norm.
    bf16: the forward pass under bfloat16 autocast; the backward pass
      follows its dtypes, the gradients and the update are float32.

  Returns:
    (cost, the gradients' global norm before clipping, the final state
    detached from this step's graph).
  """
  params = [p for p in model.parameters() if p.requires_grad]
  for p in params:
    p.grad = None
  cost, embedded, state = cost_of(model, inputs, targets, state, bf16)
  embedded.retain_grad()
  cost.backward()
  # The tutorial's norm counts the embedding's gradient as tf.gradients
  # gives it, one row per word looked up (IndexedSlices): the gradient of
  # the looked-up embeddings. The dense gradient sums a repeated word's rows.
  grads = [p.grad for p in params if p is not model.embedding.weight]
  norm = torch.nn.utils.get_total_norm(grads + [embedded.grad]).item()
  # tf.clip_by_global_norm's factor (NaN with a NaN norm), applied to the
  # learning rate: the same update as scaling every gradient, without the
  # pass over them.
  scale = max_grad_norm / max(norm, max_grad_norm)
  with torch.no_grad():
    for p in params:
      p.add_(p.grad, alpha=-lr * scale)
  return cost.item(), norm, tuple(s.detach() for s in state)


def run_epoch(model, inputs, targets, lr=None, max_grad_norm=None,
              verbose=False, bf16=False):
  """One pass over the windows, from a zero state carried between them.

  Args:
    model: a PTBModel.
    inputs, targets: int64 `[epoch_size, steps, batch]` (see windows).
    lr: the learning rate to train with; None evaluates (no dropout).
    max_grad_norm: the clipping norm, when training.
    verbose: print ptb_word_lm.py's progress line about ten times.
    bf16: each window under bfloat16 autocast, training or evaluating.

  Returns:
    The pass's perplexity.
  """
  training = lr is not None
  model.train(training)
  epoch_size, num_steps, batch_size = inputs.shape
  state = model.zero_state(batch_size)
  costs, start = 0.0, time.perf_counter()
  every = max(1, epoch_size // 10)  # ptb_word_lm.run_epoch's cadence
  with torch.set_grad_enabled(training):
    for step in range(epoch_size):
      if training:
        cost, _, state = train_step(model, inputs[step], targets[step], state,
                                    lr, max_grad_norm, bf16=bf16)
      else:
        cost, _, state = cost_of(model, inputs[step], targets[step], state,
                                 bf16)
        cost = cost.item()
      costs += cost
      if verbose and step % every == 10 % every:
        print("%.3f perplexity: %.3f speed: %.0f wps" % (
            step / epoch_size, np.exp(costs / ((step + 1) * num_steps)),
            (step + 1) * num_steps * batch_size
            / (time.perf_counter() - start)), flush=True)
  return np.exp(costs / (epoch_size * num_steps))


def _curve_fields(config):
  """The config's fields that a saved curve must continue with."""
  fields = config_lib.config_fields(config)
  return {k: v for k, v in fields.items()
          if k not in ("rnn_mode", "max_max_epoch")}


def save_epoch(path, model, config, epoch, bf16=False):
  """Saves the model after `epoch` epochs, with torch's random state.

  Each pass starts from a zero state, so the weights, the epoch and the
  dropout's random state are all a resume needs; with them goes whether
  the curve ran under --bf16, so that a resume keeps its precision. The
  file is replaced whole (written beside it, then renamed).
  """
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  torch.save({"epoch": epoch, "config": _curve_fields(config),
              "model": model.state_dict(), "rng": torch.get_rng_state(),
              "bf16": bf16}, path + ".tmp")
  os.replace(path + ".tmp", path)


def _load_save(path):
  """What save_epoch wrote to `path`, as torch.load reads it.

  Raises:
    UserError: the file is not one that save_epoch wrote.
  """
  # torch.load fails in many ways on a file not its own (cut short, another
  # format): EOFError, RuntimeError, pickle's errors and more. Any of them
  # means the same to the user; its first sentence says which it was.
  try:
    saved = torch.load(path, weights_only=False)
  except Exception as e:  # pylint: disable=broad-except
    reason = " ".join(str(e).split()).split(". ")[0]
    raise UserError("%s is not a save of torch_peer.py (%s: %s); move it "
                    "away or use another --save_path"
                    % (path, type(e).__name__, reason)) from None
  if not (isinstance(saved, dict)
          and {"epoch", "config", "model", "rng"} <= set(saved)):
    raise UserError("%s is not a save of torch_peer.py (it lacks its "
                    "fields); move it away or use another --save_path" % path)
  return saved


def load_epoch(path, model, config, bf16=False):
  """Loads what save_epoch saved into `model`; returns the epochs done.

  Returns 0 where there is no file.

  Raises:
    UserError: the file was saved with another config or the other
      precision (`bf16` is this run's --bf16), or is no save.
  """
  if not os.path.exists(path):
    return 0
  saved = _load_save(path)
  if saved["config"] != _curve_fields(config):
    raise UserError("%s was saved with another config: %s; use another "
                    "--save_path" % (path, saved["config"]))
  # Saves written before --bf16 existed lack the field: they are float32.
  if saved.get("bf16", False) != bf16:
    raise UserError("%s was saved by a curve %s --bf16; resume it %s, or use "
                    "another --save_path" % ((path,) + (
                        ("with", "with it") if saved.get("bf16", False)
                        else ("without", "without it"))))
  model.load_state_dict(saved["model"])
  torch.set_rng_state(saved["rng"])
  print("Resuming from epoch %d of %s" % (saved["epoch"], path), flush=True)
  return saved["epoch"]


def train_epochs(model, config, data, epochs, save_path=None, bf16=False):
  """Trains `epochs` epochs and tests, printing ptb_word_lm.py's lines.

  Args:
    model: a PTBModel.
    config: its config.
    data: (train, valid, test) id lists.
    epochs: how many epochs.
    save_path: a directory to save the model in after each epoch, and to
      resume from; None saves nothing.
    bf16: every pass, the training's and the evaluations', under bfloat16
      autocast.
  """
  train, valid = (windows(ids, config.batch_size, config.num_steps)
                  for ids in data[:2])
  path = save_path and os.path.join(save_path, "torch_peer.pt")
  done = load_epoch(path, model, config, bf16) if path else 0
  for epoch in range(done, epochs):
    lr = epoch_learning_rate(config, epoch)
    print("Epoch: %d Learning rate: %.3f" % (epoch + 1, lr), flush=True)
    perplexity = run_epoch(model, *train, lr, config.max_grad_norm, True,
                           bf16=bf16)
    print("Epoch: %d Train Perplexity: %.3f" % (epoch + 1, perplexity))
    print("Epoch: %d Valid Perplexity: %.3f" % (
        epoch + 1, run_epoch(model, *valid, bf16=bf16)), flush=True)
    if path:
      save_epoch(path, model, config, epoch + 1, bf16)
  print("Test Perplexity: %.3f" % run_epoch(model, *windows(data[2], 1, 1),
                                            bf16=bf16))


def measure_speed(model, config, train_ids, steps, warmup, bf16=False):
  """Times `steps` training steps after `warmup` untimed ones.

  The steps take the training windows in order, the state carried, from
  zeros at the start of each pass; with `bf16` under bfloat16 autocast.

  Returns:
    (words per second, seconds, the last step's cost per word, page faults
    per timed step).
  """
  inputs, targets = windows(train_ids, config.batch_size, config.num_steps)
  lr = epoch_learning_rate(config, 0)
  model.train()
  monitor.reset_peak_rss()  # the training's peak, as benchmark.py measures
  for i in range(warmup + steps):
    if i == warmup:
      faults = monitor.page_faults()
      start = time.perf_counter()
    window = i % len(inputs)
    if window == 0:
      state = model.zero_state(config.batch_size)
    cost, _, state = train_step(model, inputs[window], targets[window], state,
                                lr, config.max_grad_norm, bf16=bf16)
  seconds = time.perf_counter() - start
  faults = monitor.page_faults() - faults
  words = steps * config.batch_size * config.num_steps
  return words / seconds, seconds, cost / config.num_steps, faults / steps


def bf16_lstm_failure():
  """Why nn.LSTM cannot train under bfloat16 autocast here, or None.

  Autocast hands oneDNN's LSTM bfloat16 operands, and oneDNN builds that
  LSTM only on CPUs with the instructions for it; elsewhere the first step
  would end in a traceback. A one-unit LSTM, one step with gradients as in
  training, tells before any data is read. torch's random state is kept.

  Returns:
    None where it runs, else the first sentence of torch's error.
  """
  with torch.random.fork_rng(devices=[]):
    lstm = nn.LSTM(1, 1)
  try:
    with torch.autocast("cpu", dtype=torch.bfloat16):
      output, _ = lstm(torch.zeros(1, 1, 1))
    output.float().sum().backward()
  except RuntimeError as e:
    return " ".join(str(e).split()).split(". ")[0]
  return None


# The numeric flags' ranges (see config.FLAG_RANGES); torch takes seeds
# below 2**64.
_FLAG_RANGES = {"steps": (1, True), "warmup": (0, True), "epochs": (0, True),
                "seed": (0, True, 2**64 - 1)}


class _Parser(argparse.ArgumentParser):
  """argparse whose errors are one line (a UserError), not usage and line."""

  def error(self, message):
    raise UserError(message, exit_code=2)


def parse_args(argv):
  """The command line `argv`, checked: ranges, --save_path and --bf16.

  Raises:
    UserError: a flag that does not parse or is out of its range, a
      --save_path that cannot be written, or --bf16 on a CPU whose oneDNN
      has no bfloat16 LSTM.
  """
  parser = _Parser(prog="torch_peer.py",
                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--data_path", default=None,
                      help="PTB directory; unset: $PTB_DATA_PATH, else the "
                      "cache, as ptb_word_lm.py finds it")
  parser.add_argument("--model", default="small",
                      help="small, medium, large or test")
  parser.add_argument("--steps", type=int, default=60,
                      help="timed training steps")
  parser.add_argument("--warmup", type=int, default=5,
                      help="untimed training steps first")
  parser.add_argument("--epochs", type=int, default=0,
                      help="instead of timing: train this many epochs with "
                      "the tutorial's schedule, printing perplexities")
  parser.add_argument("--save_path", default=None,
                      help="with --epochs: save the model here after each "
                      "epoch, and resume from it")
  parser.add_argument("--seed", type=int, default=0,
                      help="torch's random seed")
  parser.add_argument("--config_overrides", default="",
                      help="field=value,... over the config, as in "
                      "ptb_word_lm.py")
  parser.add_argument("--bf16", action="store_true",
                      help="mixed precision, as the shared peer: each "
                      "window's forward pass and cost under "
                      "torch.autocast('cpu', dtype=torch.bfloat16), float32 "
                      "weights and update")
  args = parser.parse_args(argv)
  config_lib.check_flag_ranges({name: getattr(args, name)
                                for name in _FLAG_RANGES}, _FLAG_RANGES)
  if args.epochs and args.save_path:
    outputs.check_directory("save_path", args.save_path)
  failure = args.bf16 and bf16_lstm_failure()
  if failure:
    raise UserError("--bf16: nn.LSTM cannot run under bfloat16 autocast on "
                    "this CPU, whose oneDNN builds no bfloat16 LSTM (%s)"
                    % failure)
  return args


def main(argv=None):
  args = parse_args(argv)
  config = config_lib.resolve_config(
      config_lib.new_config(config_lib.configs_from_source(CONFIG_SCRIPT),
                            args.model), 0, args.config_overrides)
  data = reader.load_data(
      data_lib.resolve(args.data_path), config.vocab_size,
      (config.batch_size, config.batch_size, 1),
      (config.num_steps, config.num_steps, 1))
  torch.manual_seed(args.seed)
  model = PTBModel(config)
  if args.epochs:
    train_epochs(model, config, data, args.epochs, args.save_path, args.bf16)
    return
  wps, seconds, loss, faults = measure_speed(model, config, data[0],
                                             args.steps, args.warmup,
                                             args.bf16)
  # The shared peer's line: " bf16" after the model and its overrides.
  print("model=%s%s%s torch=%s threads=%d steps=%d seconds=%.2f "
        "last_loss=%.3f peak_rss_mib=%.0f page_faults_per_step=%.0f" % (
            args.model, " " + args.config_overrides if args.config_overrides
            else "", " bf16" if args.bf16 else "", torch.__version__,
            torch.get_num_threads(), args.steps, seconds, loss,
            monitor.peak_rss_mib(), faults))
  print("wps: %.0f" % wps)


def run(argv=None):
  """main, with a Stop ended as one line on stderr; returns the exit status."""
  try:
    main(argv)
  except Stop as e:
    errors.print_stop(e)
    return e.exit_code
  return 0


if __name__ == "__main__":
  sys.exit(run())
