"""Example / benchmark for building a PTB LSTM model.

Trains the model described in:
(Zaremba, et. al.) Recurrent Neural Network Regularization
http://arxiv.org/abs/1409.2329

There are 3 model configurations, and a tiny one ("test") for the tests:
===========================================
| config | epochs | train | valid  | test
===========================================
| small  | 13     | 37.99 | 121.39 | 115.91
| medium | 39     | 48.45 |  86.16 |  82.07
| large  | 55     | 37.87 |  82.62 |  78.29
The exact results may vary depending on the random initialization.

The hyperparameters used in the model:
- init_scale - the initial scale of the weights
- learning_rate - the initial value of the learning rate
- max_grad_norm - the maximum permissible norm of the gradient
- num_layers - the number of LSTM layers
- num_steps - the number of unrolled steps of LSTM
- hidden_size - the number of LSTM units
- max_epoch - the number of epochs trained with the initial learning rate
- max_max_epoch - the total number of epochs for training
- keep_prob - the probability of keeping weights in the dropout layer
- lr_decay - the decay of the learning rate for each epoch after "max_epoch"
- batch_size - the batch size
- rnn_mode - the low level implementation of lstm cell: one of BASIC, BLOCK
  or CUDNN, or AUTO for the fastest on the devices of the run

To run:

$ python ptb_word_lm.py --data_path=simple-examples/data/ --num_gpus=0

This port runs on current TensorFlow with only tensorflow, numpy and absl-py.
"""

import copy
import os
import sys
import time

# TensorFlow's C++ chatter (a failed cuInit at every start without a GPU)
# stays out of the output; real failures still reach Python as exceptions.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from ptb import errors  # pylint: disable=g-bad-import-order
from ptb import monitor  # pylint: disable=g-bad-import-order
from ptb import onednn  # pylint: disable=g-bad-import-order
from ptb import startup_log  # pylint: disable=g-bad-import-order
if __name__ == "__main__":
  errors.catch_signals()  # Ctrl-C from here on ends in one line
  # Before TensorFlow is imported: no Keras, two malloc arenas, oneDNN.
  monitor.reduce_memory_footprint()
  onednn.enable()
  startup_log.import_tensorflow()  # its C++ start-up lines held to the level

from absl import flags  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

from ptb import bfloat16
from ptb import cluster as cluster_lib
from ptb import config as config_lib
from ptb import data as data_lib
from ptb import devices as devices_lib
from ptb import dropout
from ptb import extra_flags
from ptb import low_rank_update
from ptb import original_checkpoint
from ptb import original_norm
from ptb import outputs
from ptb import plan as plan_lib
from ptb import planner
from ptb import state as state_lib
from ptb import summary as summary_lib
from ptb import summary_thread
from ptb import tower
from ptb import training
# The original's mode names, for the configs and the users of this module.
from ptb.config import AUTO, BASIC, BLOCK, CUDNN
from ptb.params import create_params
from ptb.watch import SignalCatcher, Watch
import reader
import util

flags.DEFINE_string(
    "model", "small",
    "A type of model. Possible options are: small, medium, large, test.")
flags.DEFINE_string("data_path", None,
                    "Where the PTB data is stored; unset: $PTB_DATA_PATH, "
                    "else the cache, downloaded and checked on first use.")
flags.DEFINE_string("save_path", None, "Model output directory.")
flags.DEFINE_bool("use_fp16", False,
                  "Train using 16-bit floats instead of 32bit floats")
flags.DEFINE_integer("num_gpus", 1,
                     "GPUs to train on; 0 trains on the CPU. Above 1, one "
                     "tower per GPU, each on its own rows of the batch, with "
                     "the gradients averaged.")
flags.DEFINE_string("rnn_mode", None,
                    "The low level implementation of the LSTM: BASIC (core "
                    "ops), BLOCK (a fused cell), CUDNN (cuDNN, GPUs "
                    "only) or AUTO; any case. Overrides the config.")
flags.DEFINE_string(
    "config_overrides", None,
    "Comma-separated field=value pairs that change the chosen config for this "
    "run, e.g. max_epoch=1,max_max_epoch=2.")
# The flags this port adds live in ptb/extra_flags.py; --help lists them.
flags.adopt_module_key_flags(extra_flags)
FLAGS = flags.FLAGS


# The configs a run starts from: edit them in place, or override fields with
# --config_overrides. rnn_mode AUTO runs BASIC on the CPU (the fastest there)
# and BLOCK on GPUs (the original's default); BASIC, BLOCK or CUDNN run that.
class SmallConfig(object):
  """Small config."""
  init_scale = 0.1
  learning_rate = 1.0
  max_grad_norm = 5
  num_layers = 2
  num_steps = 20
  hidden_size = 200
  max_epoch = 4
  max_max_epoch = 13
  keep_prob = 1.0
  lr_decay = 0.5
  batch_size = 20
  vocab_size = 10000
  rnn_mode = AUTO


class MediumConfig(object):
  """Medium config."""
  init_scale = 0.05
  learning_rate = 1.0
  max_grad_norm = 5
  num_layers = 2
  num_steps = 35
  hidden_size = 650
  max_epoch = 6
  max_max_epoch = 39
  keep_prob = 0.5
  lr_decay = 0.8
  batch_size = 20
  vocab_size = 10000
  rnn_mode = AUTO


class LargeConfig(object):
  """Large config."""
  init_scale = 0.04
  learning_rate = 1.0
  max_grad_norm = 10
  num_layers = 2
  num_steps = 35
  hidden_size = 1500
  max_epoch = 14
  max_max_epoch = 55
  keep_prob = 0.35
  lr_decay = 1 / 1.15
  batch_size = 20
  vocab_size = 10000
  rnn_mode = AUTO


class TestConfig(object):
  """Tiny config, for testing."""
  init_scale = 0.1
  learning_rate = 1.0
  max_grad_norm = 1
  num_layers = 1
  num_steps = 2
  hidden_size = 2
  max_epoch = 1
  max_max_epoch = 1
  keep_prob = 1.0
  lr_decay = 0.5
  batch_size = 20
  vocab_size = 10000
  rnn_mode = AUTO


CONFIGS = {"small": SmallConfig, "medium": MediumConfig, "large": LargeConfig,
           "test": TestConfig}


def data_type(use_fp16):
  return tf.float16 if use_fp16 else tf.float32


class PTBInput(object):
  """The input data.

  Attributes:
    batch_size, num_steps: rows per tower, steps per window.
    num_towers: towers fed; the producer delivers num_towers x batch_size rows.
    epoch_size, num_calls: windows and session calls per epoch.
    steps_per_call: windows per session call (1 for training).
    input_data, targets: int32 `[num_towers * batch_size,
      steps_per_call * num_steps]`; weights float32 like them (0 on
      padding), or None when steps_per_call == 1.
    position: int64 local variable, calls served (reader.producer).
  """

  def __init__(self, config, data, name=None, num_towers=1, steps_per_call=1,
               replica=(0, 1)):
    self.batch_size = batch_size = config.batch_size
    self.num_towers = num_towers
    self.num_steps = num_steps = config.num_steps
    # Worker `index` of `count` takes its own block of rows, as a tower does.
    index, count = replica
    rows = batch_size * num_towers
    self.epoch_size = reader.check_epoch_size(len(data), rows * count,
                                              num_steps, name)
    self.steps_per_call = steps_per_call = min(steps_per_call, self.epoch_size)
    producer = reader.producer(data, rows * count, num_steps, steps_per_call,
                               name=name)
    self.num_calls = producer.num_calls
    mine = slice(index * rows, (index + 1) * rows)
    self.input_data, self.targets = producer.x[mine], producer.y[mine]
    self.weights = None if producer.weights is None else producer.weights[mine]
    self.position = producer.position

  def steps_in_call(self, call):
    """Real (unpadded) windows in session call number `call`."""
    return min(self.steps_per_call,
               self.epoch_size - call * self.steps_per_call)


class PTBModel(object):
  """The PTB model.

  The graph keeps each tower's LSTM state in a local variable, so a step
  needs no feed: `update_state` stores the final state that the next call's
  `initial_state` reads, and `reset_state` zeroes it at the start of a pass.
  """

  def __init__(self, is_training, config, input_, devices=("/cpu:0",),
               use_fp16=False, replica=(0, 1), carry_state=True, plan=None):
    """Builds the model.

    Args:
      is_training: build dropout and the training op.
      config: a config instance.
      input_: a PTBInput with `len(devices)` towers.
      devices: one device per tower.
      use_fp16: float16 variables and activations.
      replica: (index, count) of the processes training (util.train_op).
      carry_state: each step starts from the previous step's final state;
        False starts every step from zeros (--train_from_zero_state).
      plan: this model's part of the run's plan (a plan.Step: its LSTM
        path, products, softmax loss, updates, norm); None: the rules'
        for this input, devices and dtype (float32 products).
    """
    self._input = input_
    dtype = data_type(use_fp16)
    plan = plan or plan_lib.step(
        config, input_.batch_size, input_.num_steps * input_.steps_per_call,
        devices, dtype, plan_lib.offered(), is_training, replica[1])

    with tf.device(util.variable_device(devices)):
      params = create_params(config, dtype)
      seeds = dropout.tower_seeds(
          len(devices), is_training and config.keep_prob < 1)
      if is_training:
        self._lr = tf.compat.v1.Variable(0.0, trainable=False,
                                         name="learning_rate")
        self._new_lr = tf.compat.v1.placeholder(
            tf.float32, shape=[], name="new_learning_rate")
        self._lr_update = tf.compat.v1.assign(self._lr, self._new_lr)

    variables = params.as_list()
    rows = zip(*(util.split_rows(t, len(devices)) for t in (
        input_.input_data, input_.targets, input_.weights)))
    costs, tower_grads, self._states = [], [], []
    for k, (device, seed, (x, y, w)) in enumerate(zip(devices, seeds, rows)):
      with tf.device(device), tf.name_scope("tower_%d" % k):
        # The backward pass puts the gradients it gives as factors here.
        factors = {} if plan.updates == plan_lib.FACTORS else None
        cost, state = tower.build(x, y, w, params, config, dtype, seed, plan,
                                  factors)
        costs.append(cost)
        self._states.append(state)
        if is_training:
          tower_grads.append(low_rank_update.with_factors(
              tf.compat.v1.gradients(cost, variables,
                                     colocate_gradients_with_ops=True),
              variables, factors))
    # The towers' average cost is the cost of one tower with all their rows.
    self._cost = costs[0] if len(costs) == 1 else tf.add_n(costs) / len(costs)

    if is_training:
      with tf.device(util.variable_device(devices)):
        self._train_op = util.train_op(
            tower_grads, variables, self._lr, config.max_grad_norm, replica,
            plan.isa, plan.norm_threads)
    self.update_state, self.reset_state = state_lib.store_and_reset(
        self._states, [self._train_op if is_training else self._cost],
        carry_state)

  def assign_lr(self, session, lr_value):
    session.run(self._lr_update, feed_dict={self._new_lr: lr_value})

  @property
  def input(self):
    return self._input

  @property
  def initial_state(self):
    """The first tower's initial state: a tuple of LSTMStateTuple."""
    return self._states[0].initial

  @property
  def final_state(self):
    """The first tower's final state: a tuple of LSTMStateTuple."""
    return self._states[0].final

  @property
  def dropout_masks(self):
    """The first tower's dropout masks ({} without): dropout.model_masks."""
    return self._states[0].masks

  @property
  def cost(self):
    return self._cost

  @property
  def lr(self):
    return self._lr

  @property
  def train_op(self):
    return self._train_op

  @property
  def state_variables(self):
    """Each tower's `[layers, 2, batch, hidden]` LSTM state variable."""
    return [s.variable for s in self._states]


def run_epoch(session, model, eval_op=None, verbose=False, start=None,
              on_step=None):
  """Runs the model over one pass of its input.

  Args:
    session: a tf.compat.v1.Session.
    model: a PTBModel.
    eval_op: an op to run with every step (the training op), or None.
    verbose: print the progress line about ten times.
    start: (step, costs) to resume a pass part-way (state and input
      position restored from a checkpoint); None starts afresh.
    on_step: on_step(step, cost, costs) after every session call; it may
      raise to stop the pass.

  Returns:
    The perplexity of the pass.
  """
  start_time = time.time()
  data = model.input
  first, costs = start or (0, 0.0)
  if start is None:
    session.run(model.reset_state)
  iters = sum(data.num_steps * data.steps_in_call(c) for c in range(first))
  fetches = {"cost": model.cost, "state": model.update_state}
  if eval_op is not None:
    fetches["eval_op"] = eval_op
  # The original printed at step % (epoch_size // 10) == 10: no line below
  # 110 steps, a division by zero below 10. Its cadence, and ~10 lines on any.
  every = max(1, data.epoch_size // 10)
  words_per_window = data.batch_size * data.num_towers * data.num_steps
  for step in range(first, data.num_calls):
    cost = session.run(fetches)["cost"]
    costs += cost
    iters += data.num_steps * data.steps_in_call(step)
    if on_step is not None:
      on_step(step, cost, costs)
    if verbose and step % every == 10 % every:
      print("%.3f perplexity: %.3f speed: %.0f wps" %
            (step * 1.0 / data.epoch_size, np.exp(costs / iters),
             (step + 1 - first) * words_per_window /
             (time.time() - start_time)), flush=True)
  return np.exp(costs / iters)


def get_config(model, rnn_mode=None):
  """Returns a fresh config instance for `model`, with `rnn_mode` if given."""
  return config_lib.new_config(CONFIGS, model, rnn_mode)


def build_model(name, is_training, config, data, devices, use_fp16=False,
                steps_per_call=1, reuse=False, replica=(0, 1),
                carry_state=True, plan=None):
  """One PTBInput and PTBModel under `name` ("Train", "Valid", ...).

  The first model creates the weights in variable scope "Model"
  (reuse=False), the others share them; `replica`, `carry_state` and
  `plan` (a plan.Step) as in PTBModel.
  """
  initializer = tf.compat.v1.random_uniform_initializer(
      -config.init_scale, config.init_scale)
  with tf.compat.v1.name_scope(name):
    input_ = PTBInput(config=config, data=data, name=name + "Input",
                      num_towers=len(devices), steps_per_call=steps_per_call,
                      replica=replica)
    with tf.compat.v1.variable_scope("Model", reuse=reuse,
                                     initializer=initializer):
      return PTBModel(is_training=is_training, config=config, input_=input_,
                      devices=devices, use_fp16=use_fp16,
                      replica=replica if is_training else (0, 1),
                      carry_state=carry_state, plan=plan)


def build_models(config, eval_config, data, devices, use_fp16, eval_unroll,
                 replica=(0, 1), train_from_zero_state=False, plan=None):
  """(m, mvalid, mtest): the Train, Valid and Test models, sharing weights.

  Validation and test run `max(1, eval_unroll // num_steps)` windows per
  session call, unrolled in the graph, their state carried (training's
  unless `train_from_zero_state`). Each follows its part of `plan` (a
  plan.Plan; None: the rules' for these configs, float32 products).
  """
  plan = plan or plan_lib.make(config, devices, data_type(use_fp16),
                               plan_lib.offered(), replica[1], eval_config,
                               eval_unroll)
  train_data, valid_data, test_data = data
  models = [build_model("Train", True, config, train_data, devices, use_fp16,
                        replica=replica, carry_state=not train_from_zero_state,
                        plan=plan.train)]
  for name, eval_cfg, ids, part in (
      ("Valid", config, valid_data, plan.valid),
      ("Test", eval_config, test_data, plan.test)):
    models.append(build_model(
        name, False, eval_cfg, ids, devices[:1], use_fp16,
        plan_lib.eval_windows(eval_unroll, eval_cfg.num_steps), reuse=True,
        plan=part))
  return tuple(models)


def main(_):
  start_time = time.time()
  config_lib.check_flag_ranges(
      {name: FLAGS[name].value for name in config_lib.FLAG_RANGES})
  cluster = cluster_lib.from_flags(
      FLAGS.job_name, FLAGS.task_index, FLAGS.ps_hosts, FLAGS.worker_hosts,
      os.environ.get("TF_CONFIG"))
  if cluster_lib.serve_if_ps(cluster, FLAGS.cluster_timeout,
                              FLAGS.save_every_steps):
    return
  outputs.check_all(FLAGS.save_path, FLAGS.memory_log, FLAGS.summary_json)
  config = config_lib.resolve_config(get_config(FLAGS.model, FLAGS.rnn_mode),
                                     FLAGS.num_gpus, FLAGS.config_overrides)
  devices = devices_lib.check_devices(FLAGS.num_gpus, config.rnn_mode,
                                      FLAGS.cpu_towers)
  bfloat16.check(FLAGS.use_bf16, FLAGS.use_fp16, FLAGS.force_bf16, devices,
                 config.rnn_mode)
  original_norm.check(FLAGS.original_norm_threads, FLAGS.use_fp16)
  init_from = original_checkpoint.check_flags(
      FLAGS.init_from, FLAGS.eval_only, FLAGS.save_path, config,
      data_type(FLAGS.use_fp16))
  eval_config = copy.copy(config)
  eval_config.batch_size = eval_config.num_steps = 1
  take_calls = summary_thread.check(
      FLAGS.original_summary_secs, plan_lib.eval_windows(
          FLAGS.eval_unroll, config.num_steps), FLAGS.original_summary_calls)
  replica = training.replica(cluster)  # (this worker, workers)
  data = reader.load_data(
      data_lib.resolve(FLAGS.data_path), config.vocab_size,
      (config.batch_size * len(devices) * replica[1], config.batch_size, 1),
      (config.num_steps, config.num_steps, 1))
  # Refusals once the input is good, before anything is written.
  chief = training.is_chief(cluster)
  outputs.lock(FLAGS.save_path, chief)
  record = training.run_record(config, devices, cluster, **{
      name: FLAGS[name].value for name in training.RECORDED_FLAGS})
  resume = training.find_resume(FLAGS.save_path, record, cluster)
  # Every choice of the steps to come, made here once (ptb/plan.py).
  plan = planner.make(FLAGS.plan, config, devices, data_type(FLAGS.use_fp16),
                      plan_lib.offered(), replica[1], eval_config,
                      FLAGS.eval_unroll, bfloat16.products(FLAGS.use_bf16))
  plan = plan_lib.with_original_norm(plan, FLAGS.original_norm_threads)
  print(plan_lib.line(plan), file=sys.stderr, flush=True)
  summary = summary_lib.Summary(
      FLAGS.summary_json, sys.argv, FLAGS.model, config, devices, start_time,
      FLAGS.train_from_zero_state, plan=plan_lib.record(plan))
  with training.memory_log(FLAGS.memory_log, FLAGS.memory_interval, devices,
                           FLAGS.save_path) as sampler:
    with tf.Graph().as_default() as graph, training.placement(cluster):
      if FLAGS.seed is not None:
        tf.compat.v1.set_random_seed(FLAGS.seed)
      m, mvalid, mtest = build_models(config, eval_config, data, devices,
                                      FLAGS.use_fp16, FLAGS.eval_unroll,
                                      replica, FLAGS.train_from_zero_state,
                                      plan)
      run_state = training.RunState(
          FLAGS.save_path, m, resume, summary, record, cluster,
          FLAGS.cluster_timeout, init_from)
      done = cluster_lib.done_ops(cluster) if cluster else []
      window_taker = summary_thread.WindowTaker(
          FLAGS.original_summary_secs, [m.input, mvalid.input], take_calls)
    with training.open_session(
        graph, devices, FLAGS.intra_op_threads, FLAGS.inter_op_threads,
        cluster, FLAGS.cluster_timeout) as session, SignalCatcher() as signals:
      watch = Watch(session, signals, run_state, m.input, sampler,
                    FLAGS.save_every_steps, cluster, window_taker)
      first_epoch, start = run_state.initialize(session)
      # Start-up is over; the library code it ran need not stay resident.
      monitor.release_library_pages()
      epochs = training.EpochLog(summary, run_state, watch, config.num_steps,
                                 replica[1], bool(cluster))
      with training.summarize_failures(summary, watch.where, cluster,
                                       FLAGS.cluster_timeout):
        last_epoch = first_epoch if FLAGS.eval_only else config.max_max_epoch
        for i in range(first_epoch, last_epoch):
          lr = config_lib.epoch_learning_rate(config, i)
          m.assign_lr(session, lr)
          print("Epoch: %d Learning rate: %.3f" % (i + 1, session.run(m.lr)))
          train_perplexity = run_epoch(
              session, m, eval_op=m.train_op, verbose=True, start=start,
              on_step=watch.begin("train", i + 1, start))
          print("Epoch: %d Train Perplexity: %.3f" % (i + 1, train_perplexity))
          start = None
          if not chief:
            continue
          epochs.print_cluster_speed(i + 1)
          valid_perplexity = run_epoch(
              session, mvalid, on_step=watch.begin("valid", i + 1))
          print("Epoch: %d Valid Perplexity: %.3f" % (i + 1, valid_perplexity))
          epochs.add(session, i + 1, lr, train_perplexity, valid_perplexity)
        if chief and FLAGS.eval_only:
          print("Valid Perplexity: %.3f" % run_epoch(
              session, mvalid, on_step=watch.begin("valid", 0)))
        if chief:
          test_perplexity = run_epoch(
              session, mtest, on_step=watch.begin("test", config.max_max_epoch))
      if chief:
        print("Test Perplexity: %.3f" % test_perplexity)
        summary.fields["test_perplexity"] = float(test_perplexity)
      training.print_peak_memory(devices)
      if run_state.saving and run_state.finish(session):
        print("Saving model to %s." % FLAGS.save_path)
      session.run(done)  # a cluster's ps tasks wait for every worker's
      epochs.close()
      with training.summarize_failures(summary, watch.where):
        run_state.check_saved()
      summary.publish("finished")


if __name__ == "__main__":
  errors.run_main(main)
