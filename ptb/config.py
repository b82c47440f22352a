"""The rnn modes, --config_overrides and the checks of a config's values."""

import ast
import numbers
import sys

from absl import logging

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
  """Applies "field=value,..." to `config`; returns the fields it set.

  Each value is read as its field's kind (FIELDS) takes it.
  """
  fields = declared_fields(config)
  changed = {}
  for item in filter(None, (s.strip() for s in overrides.split(","))):
    name, sep, text = item.partition("=")
    name, text = name.strip(), text.strip()
    if not sep or name not in fields:
      raise UserError("--config_overrides: unknown field %r in %r; fields are "
                      "%s" % (name, item, ", ".join(fields)), exit_code=2)
    if FIELDS[name][0] == MODE:
      value = parse_rnn_mode(text, "--config_overrides " + name)
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


# The kinds of config field. A field's kind says what it takes, from an
# override and from a class edited in place alike.
SIZE = "size"  # of the model or of a batch: a whole number, at least 1
COUNT = "count"  # of epochs: a whole number, at least 1
RATE = "rate"  # a rate, norm, scale or decay: a positive finite number
PROBABILITY = "probability"  # a number in (0, 1]
MODE = "mode"  # an rnn mode or AUTO, in any case (parse_rnn_mode)
KINDS = (SIZE, COUNT, RATE, PROBABILITY, MODE)
# The kinds that take whole numbers; the other numbers are kept as floats,
# so that `keep_prob = 1` in a class means what `keep_prob = 1.0` means.
WHOLE_KINDS = (SIZE, COUNT)

# Every config field: its kind and, for a size or a count, a bound that no
# machine of today trains within a lifetime (a value above it is a typo, an
# extra zero or two, not a benchmark). The checks read this table alone,
# and a config with a field that is not here is refused: a new field must
# say what it takes.
FIELDS = {
    "init_scale": (RATE, None),
    "learning_rate": (RATE, None),
    "max_grad_norm": (RATE, None),
    "num_layers": (SIZE, 1000),
    "num_steps": (SIZE, 100000),
    "hidden_size": (SIZE, 100000),
    "max_epoch": (COUNT, 1000000),
    "max_max_epoch": (COUNT, 1000000),
    "keep_prob": (PROBABILITY, None),
    "lr_decay": (RATE, None),
    "batch_size": (SIZE, 1000000),
    "vocab_size": (SIZE, 100000000),
    "rnn_mode": (MODE, None),
}

# The valid values of each number kind, as FLAG_RANGES writes a flag's: the
# lowest, whether it is valid itself, and the highest, which a size or a
# count takes from its field. A rate stops at the largest finite float:
# an infinite one trains nothing (and NaN falls below every lowest).
_KIND_RANGES = {SIZE: (1, True), COUNT: (1, True),
                RATE: (0, False, sys.float_info.max),
                PROBABILITY: (0, False, 1)}
# What an error says a value of each number kind must be.
_MUST_BE = {SIZE: "a positive integer", COUNT: "a positive integer",
            RATE: "a positive number", PROBABILITY: "in (0, 1]"}


def declared_fields(config):
  """config_fields(config), refused unless its fields are those of FIELDS.

  Args:
    config: a config instance.

  Raises:
    UserError: a field without a kind (one just added to a class, say), or
      a field of FIELDS that the config lacks.
  """
  fields = config_fields(config)
  for name in fields:
    if name not in FIELDS:
      raise UserError(
          "config field %s of %s has no kind: add it to FIELDS in "
          "ptb/config.py as a %s or %s" % (name, type(config).__name__,
                                           ", ".join(KINDS[:-1]), KINDS[-1]),
          exit_code=2)
  for name in FIELDS:
    if name not in fields:
      raise UserError("config %s has no field %s"
                      % (type(config).__name__, name), exit_code=2)
  return fields


def field_value(name, value, shown):
  """`value` as number field `name` takes it: an int or a float by its kind.

  Args:
    name: a config field of a number kind (FIELDS).
    value: a number from an override or a class (any other type is refused).
    shown: the field and value as the error message names them, with where
      they come from.

  Raises:
    UserError: a size or count that is not a whole number, or a rate,
      norm, scale or probability that is not a number.
  """
  number = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if FIELDS[name][0] in WHOLE_KINDS:
    if not (number and isinstance(value, numbers.Integral)):
      raise UserError("%s must be a whole number (a size or a count)"
                      % shown, exit_code=2)
    return int(value)
  if not number:
    raise UserError("%s must be a number" % shown, exit_code=2)
  return float(value)


def check_field_range(name, value):
  """Refuses `value` of number field `name` outside its kind's range.

  Args:
    name: a config field of a number kind (FIELDS).
    value: its value, as field_value returns it.
  """
  kind, highest = FIELDS[name]
  valid = _KIND_RANGES[kind] + ((highest,) if highest else ())
  beyond = out_of_range(value, valid)
  if beyond == "high" and kind in WHOLE_KINDS:
    raise UserError("config %s=%r is absurdly large (more than %d)"
                    % (name, value, highest), exit_code=2)
  if beyond:
    raise UserError("config %s=%r must be %s" % (name, value, _MUST_BE[kind]),
                    exit_code=2)


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

  A class edited in place is held to its fields' kinds (FIELDS) as an
  override is: its sizes and counts must be whole numbers, its other
  numbers become floats, each number must lie in its kind's range, and
  its mode becomes the lower-case name of one.

  Raises:
    UserError: a field without a kind, or a value that its kind refuses.
  """
  for name, value in declared_fields(config).items():
    if FIELDS[name][0] == MODE:
      value = parse_rnn_mode(value, "config " + name)
    else:
      value = field_value(name, value, "config %s=%r" % (name, value))
      check_field_range(name, value)
    setattr(config, name, value)


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
  changed = apply_overrides(config, overrides) if overrides else {}
  validate_config(config)
  if announce and changed:  # only once they are known to be good
    print("Config overrides: %s" % ", ".join("%s=%s" % kv
                                             for kv in changed.items()))
  mode = config.rnn_mode  # validated: a mode's name, in lower case
  config.rnn_mode = auto_rnn_mode(num_gpus) if mode == AUTO else mode
  if announce:
    logging.info("rnn_mode: %s%s", config.rnn_mode.upper(),
                 " (AUTO on the %s)" % ("GPU" if num_gpus else "CPU")
                 if mode == AUTO else "")
  return config


def auto_rnn_mode(num_gpus):
  """What AUTO runs: BASIC on the CPU (the fastest there), BLOCK on GPUs."""
  return BLOCK if num_gpus else BASIC


# The longest interval a flag in seconds takes: a day. A longer one is a
# typo, and an infinite one breaks the clocks that wait on it.
MAX_SECONDS = 86400.0
# Each numeric flag's lowest valid value, and whether the value itself is
# allowed; a third item, where there is one, is the highest valid value.
FLAG_RANGES = {"num_gpus": (0, True), "cpu_towers": (1, True),
               "intra_op_threads": (0, True), "inter_op_threads": (0, True),
               "eval_unroll": (1, True), "seed": (0, True),
               "save_every_steps": (0, True),
               "memory_interval": (0, False, MAX_SECONDS),
               "original_summary_secs": (0, True, MAX_SECONDS),
               "original_norm_threads": (0, True),
               "task_index": (0, True),
               "cluster_timeout": (0, False, MAX_SECONDS)}


def out_of_range(value, valid):
  """Which end of the range `valid` the number `value` lies beyond.

  Args:
    value: a number.
    valid: (low, whether low is allowed[, high]), as FLAG_RANGES has them.

  Returns:
    "low", "high", or None where `value` lies in the range.
  """
  low, inclusive, *high = valid
  # Written so that NaN, which no comparison holds for, lies below.
  if not (value >= low if inclusive else value > low):
    return "low"
  if high and not value <= high[0]:
    return "high"
  return None


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
    low, inclusive, *high = valid = (ranges or FLAG_RANGES)[name]
    beyond = out_of_range(value, valid)
    if beyond == "low":
      bound = (("0 or more" if inclusive else "positive") if low == 0 else
               ("at least %s" if inclusive else "more than %s") % low)
      raise UserError("--%s=%s must be %s" % (name, value, bound),
                      exit_code=2)
    if beyond == "high":
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


def configs_from_source(path, class_names=None):
  """The config classes of the script `path`, read without running it.

  A program that must not import the script (torch_peer.py: ptb_word_lm.py
  imports TensorFlow; compare_original.py: the original imports TensorFlow
  1.x) takes its configs from the source, as the user edited them in place:
  the classes, executed with the rnn_mode names.

  Args:
    path: the script.
    class_names: {model name: class name}; None reads the script's
      `CONFIGS` table.

  Returns:
    {model name: config class}.
  """
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  table = []
  if class_names is None:
    table = [next(node for node in tree.body if isinstance(node, ast.Assign)
                  and [t.id for t in node.targets
                       if isinstance(t, ast.Name)] == ["CONFIGS"])]
    names = {n.id for n in ast.walk(table[0].value)
             if isinstance(n, ast.Name)}
  else:
    names = set(class_names.values())
  classes = [node for node in tree.body
             if isinstance(node, ast.ClassDef) and node.name in names]
  namespace = {"AUTO": AUTO, "BASIC": BASIC, "BLOCK": BLOCK, "CUDNN": CUDNN}
  module = ast.Module(body=classes + table, type_ignores=[])
  exec(compile(module, path, "exec"), namespace)  # pylint: disable=exec-used
  if class_names is None:
    return namespace["CONFIGS"]
  return {model: namespace[name] for model, name in class_names.items()}
