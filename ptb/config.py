"""The rnn modes, --config_overrides and the checks of a config's values."""

import ast
import numbers

from absl import logging
import numpy as np

from ptb.errors import UserError

BASIC = "basic"
CUDNN = "cudnn"
BLOCK = "block"
# The fastest mode for the devices of the run: see auto_rnn_mode.
AUTO = "auto"
RNN_MODES = (BASIC, BLOCK, CUDNN)


def parse_rnn_mode(value, source="--rnn_mode"):
  """The mode named by `value` (any case); `source` names it in the error."""
  mode = str(value).lower()
  if mode not in RNN_MODES + (AUTO,):
    raise UserError("Invalid %s=%s; valid values are AUTO, BASIC, BLOCK, "
                    "CUDNN (any case)" % (source, value), exit_code=2)
  return mode


def config_fields(config):
  """The config's fields and values, in a stable order."""
  return {k: getattr(config, k) for k in sorted(dir(config))
          if not k.startswith("_") and not callable(getattr(config, k))}


def apply_overrides(config, overrides):
  """Applies "field=value,..." to `config`; returns the fields it set."""
  fields = config_fields(config)
  changed = {}
  for item in filter(None, (s.strip() for s in overrides.split(","))):
    name, sep, text = item.partition("=")
    name, text = name.strip(), text.strip()
    if not sep or name not in fields:
      raise UserError("--config_overrides: unknown field %r in %r; fields are "
                      "%s" % (name, item, ", ".join(fields)), exit_code=2)
    if name == "rnn_mode":
      value = parse_rnn_mode(text, "--config_overrides rnn_mode")
    else:
      value = field_value(name, _number(text),
                          "--config_overrides: %s=%s" % (name, text))
    setattr(config, name, value)
    changed[name] = value
  return changed


def _number(text):
  """The int or float that `text` writes, or `text` if it writes neither."""
  for parse in (int, float):
    try:
      return parse(text)
    except ValueError:
      pass
  return text


# Upper bounds that no machine of today trains within a lifetime: a value
# above them is a typo (an extra zero or two), not a benchmark.
_MAX_INTS = {"num_layers": 1000, "num_steps": 100000, "hidden_size": 100000,
             "max_epoch": 1000000, "max_max_epoch": 1000000,
             "batch_size": 1000000, "vocab_size": 100000000}

# Sizes and counts: whole numbers.
INT_FIELDS = tuple(_MAX_INTS)
# Rates, norms, scales and probabilities: any number, kept as a float, so
# that `keep_prob = 1` in a class means what `keep_prob = 1.0` means.
FLOAT_FIELDS = ("init_scale", "learning_rate", "max_grad_norm", "lr_decay",
                "keep_prob")


def field_value(name, value, shown):
  """`value` as field `name` takes it: an int or a float by its meaning.

  Args:
    name: the config field.
    value: a number from an override or a class (any other type is refused).
    shown: the field and value as the error message names them, with where
      they come from.

  Raises:
    UserError: a size or count that is not a whole number, or a rate,
      norm, scale or probability that is not a number.
  """
  number = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if name in INT_FIELDS:
    if not (number and isinstance(value, numbers.Integral)):
      raise UserError("%s must be a whole number (a size or a count)"
                      % shown, exit_code=2)
    return int(value)
  if not number:
    raise UserError("%s must be a number" % shown, exit_code=2)
  return float(value) if name in FLOAT_FIELDS else value


def new_config(configs, model, rnn_mode=None):
  """A fresh instance of configs[model], with `rnn_mode` if given.

  Args:
    configs: {name: config class}.
    model: the --model value.
    rnn_mode: the --rnn_mode value, or None to keep the class's.
  """
  if model not in configs:
    # The original raised ValueError("Invalid model: %s", model): a tuple,
    # never formatted. Here the message is formatted and lists the choices.
    raise UserError("Invalid model: %s; valid values are %s"
                    % (model, ", ".join(configs)), exit_code=2)
  config = configs[model]()
  if rnn_mode:
    config.rnn_mode = parse_rnn_mode(rnn_mode)
  return config


def validate_config(config):
  """Refuses values that cannot train, with the field named.

  A class edited in place is held to the kinds of field_value: its sizes
  and counts must be whole numbers, and its other numbers become floats.
  """
  for name in INT_FIELDS + FLOAT_FIELDS:
    value = getattr(config, name)
    setattr(config, name,
            field_value(name, value, "config %s=%r" % (name, value)))
  for name, limit in _MAX_INTS.items():
    value = getattr(config, name)
    if value <= 0:
      raise UserError("config %s=%r must be a positive integer"
                      % (name, value), exit_code=2)
    if value > limit:
      raise UserError("config %s=%d is absurdly large (more than %d)"
                      % (name, value, limit), exit_code=2)
  for name in FLOAT_FIELDS[:-1]:  # all but keep_prob
    value = getattr(config, name)
    if not value > 0 or not np.isfinite(value):
      raise UserError("config %s=%r must be a positive number"
                      % (name, value), exit_code=2)
  if not 0 < config.keep_prob <= 1:
    raise UserError("config keep_prob=%r must be in (0, 1]" % config.keep_prob,
                    exit_code=2)


def resolve_config(config, num_gpus, overrides, announce=True):
  """The config a run uses: the class's fields, then --config_overrides.

  Args:
    config: a fresh config instance, with --rnn_mode applied if given.
    num_gpus: 0 trains on the CPU.
    overrides: the --config_overrides text, or None.
    announce: print the overrides and log the mode; False only checks (as
      benchmark.py does for every combination before it measures one).

  Returns:
    `config`, validated, with AUTO replaced by the mode it picks here.
  """
  if overrides:
    changed = apply_overrides(config, overrides)
    if announce:
      print("Config overrides: %s" % ", ".join("%s=%s" % kv
                                               for kv in changed.items()))
  validate_config(config)
  mode = parse_rnn_mode(config.rnn_mode, "config rnn_mode")
  config.rnn_mode = auto_rnn_mode(num_gpus) if mode == AUTO else mode
  if announce:
    logging.info("rnn_mode: %s%s", config.rnn_mode.upper(),
                 " (AUTO on the %s)" % ("GPU" if num_gpus else "CPU")
                 if mode == AUTO else "")
  return config


def auto_rnn_mode(num_gpus):
  """What AUTO runs: BASIC on the CPU (the fastest there), BLOCK on GPUs."""
  return BLOCK if num_gpus else BASIC


# Each numeric flag's lowest valid value, and whether the value itself is
# allowed; a third item, where there is one, is the highest valid value.
FLAG_RANGES = {"num_gpus": (0, True), "cpu_towers": (1, True),
               "intra_op_threads": (0, True), "inter_op_threads": (0, True),
               "eval_unroll": (1, True), "seed": (0, True),
               "save_every_steps": (0, True), "memory_interval": (0, False),
               "task_index": (0, True), "cluster_timeout": (0, False)}


def check_flag_ranges(values, ranges=None):
  """Refuses a numeric flag outside its range, with its name.

  Args:
    values: {flag name: value} for the names of `ranges`.
    ranges: {flag name: (low, whether low is allowed[, high])}, as
      FLAG_RANGES (the default) has them for ptb_word_lm.py's flags; the
      other scripts give their own flags' ranges.
  """
  for name, value in values.items():
    if value is None:  # unset, e.g. --seed
      continue
    low, inclusive, *high = (ranges or FLAG_RANGES)[name]
    # Written so that NaN, which no comparison holds for, is refused.
    if not (value >= low if inclusive else value > low):
      bound = (("0 or more" if inclusive else "positive") if low == 0 else
               ("at least %s" if inclusive else "more than %s") % low)
      raise UserError("--%s=%s must be %s" % (name, value, bound),
                      exit_code=2)
    if high and not value <= high[0]:
      raise UserError("--%s=%s must be at most %s" % (name, value, high[0]),
                      exit_code=2)


def check_absl_flags(flag_values, ranges):
  """check_flag_ranges of the absl flags that `ranges` names.

  Args:
    flag_values: the script's absl FlagValues, parsed.
    ranges: as check_flag_ranges takes them.
  """
  check_flag_ranges({name: flag_values[name].value for name in ranges},
                    ranges)


def epoch_learning_rate(config, epoch):
  """The learning rate of epoch `epoch` (from 0): decayed after max_epoch."""
  return config.learning_rate * config.lr_decay ** max(
      epoch + 1 - config.max_epoch, 0.0)


def configs_from_source(path):
  """The config classes of the script `path`, read without running it.

  A program that must not import the script (torch_peer.py: ptb_word_lm.py
  imports TensorFlow) takes its configs from the source, as the user edited
  them in place: the `CONFIGS` table and the classes it names, executed
  with the rnn_mode names.

  Returns:
    {model name: config class}.
  """
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  table = next(node for node in tree.body if isinstance(node, ast.Assign)
               and [t.id for t in node.targets
                    if isinstance(t, ast.Name)] == ["CONFIGS"])
  names = {n.id for n in ast.walk(table.value) if isinstance(n, ast.Name)}
  classes = [node for node in tree.body
             if isinstance(node, ast.ClassDef) and node.name in names]
  namespace = {"AUTO": AUTO, "BASIC": BASIC, "BLOCK": BLOCK, "CUDNN": CUDNN}
  module = ast.Module(body=classes + [table], type_ignores=[])
  exec(compile(module, path, "exec"), namespace)  # pylint: disable=exec-used
  return namespace["CONFIGS"]
