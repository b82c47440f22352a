"""Utilities for parsing PTB text files.

Text -> word ids -> `[batch_size, num_steps]` input/target tensors. This module
knows nothing of flags or models. Only the producers, which build tensors,
import TensorFlow: the ids and windows are numpy's, so that the PyTorch peer
(torch_peer.py) reads the corpus without TensorFlow in its process.
"""

import collections

import numpy as np

# Imported for the tests and tools that read reader.FILE_NAMES.
from ptb.data import FILE_NAMES  # pylint: disable=unused-import
from ptb.data import corpus_files
from ptb.errors import DataError


def _read_words(filename):
  """Reads a text file as UTF-8 and returns its tokens, newlines as `<eos>`.

  A leading byte order mark (U+FEFF, which some editors write at the start
  of a UTF-8 file) marks the encoding and is no word: it is dropped.

  Raises:
    DataError: the file is missing, unreadable, not UTF-8 text, or holds no
      word (line ends alone are none).
  """
  try:
    with open(filename, "rb") as f:
      raw = f.read()
  except IsADirectoryError:
    raise DataError("%s is a directory, not a text file" % filename) from None
  except FileNotFoundError:
    raise DataError("%s does not exist" % filename) from None
  except OSError as e:
    raise DataError("cannot read %s: %s" % (filename, e.strerror)) from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise DataError("%s is not UTF-8 text: invalid byte 0x%02x at byte offset %d"
                    % (filename, raw[e.start], e.start)) from None
  if text.startswith("\ufeff"):
    text = text[1:]
  words = text.replace("\n", " <eos> ").split()
  if not words:
    raise DataError("%s is empty: it holds no words" % filename)
  if all(word == "<eos>" for word in words):
    raise DataError("%s holds no words, only %d line ends" % (filename,
                                                               len(words)))
  return words


def _build_vocab(words):
  """Maps words to ids by descending count, ties broken by the word itself."""
  counter = collections.Counter(words)
  count_pairs = sorted(counter.items(), key=lambda x: (-x[1], x[0]))
  return {word: i for i, (word, _) in enumerate(count_pairs)}


def _word_ids(words, word_to_id):
  """Converts words to ids; words outside the vocabulary are dropped."""
  return [word_to_id[w] for w in words if w in word_to_id]


def ptb_raw_data(data_path):
  """Loads the PTB training, validation and test files from `data_path`.

  The vocabulary is built from the training file only; words of the
  validation and test files that are not in it are dropped.

  Args:
    data_path: directory holding ptb.train.txt, ptb.valid.txt, ptb.test.txt.

  Returns:
    (train_ids, valid_ids, test_ids, vocab_size): three lists of int word ids
    and the number of distinct training words.

  Raises:
    DataError: the directory or a file is missing or unusable; the message
      names it and says how to get the data.
  """
  paths = corpus_files(data_path)
  train_words, valid_words, test_words = (_read_words(p) for p in paths)
  word_to_id = _build_vocab(train_words)
  return (_word_ids(train_words, word_to_id), _word_ids(valid_words, word_to_id),
          _word_ids(test_words, word_to_id), len(word_to_id))


def epoch_size(data_len, batch_size, num_steps):
  """Number of `num_steps` windows in one pass over `data_len` ids."""
  return ((data_len // batch_size) - 1) // num_steps


def check_epoch_size(data_len, batch_size, num_steps, name="data"):
  """Returns the epoch size, raising DataError when it is zero."""
  size = epoch_size(data_len, batch_size, num_steps)
  if size <= 0:
    raise DataError(
        "epoch_size == 0, decrease batch_size or num_steps: %s has %d words, "
        "too few for batch_size=%d and num_steps=%d (it needs at least %d)"
        % (name, data_len, batch_size, num_steps, batch_size * (num_steps + 1)))
  return size


def chunk_windows(raw_data, batch_size, num_steps, steps_per_call=1):
  """Arranges one epoch of ids into calls of `steps_per_call` windows each.

  The ids are cut into `batch_size` contiguous rows of `len // batch_size`
  ids (the tail is dropped). Window i is columns [i*num_steps, (i+1)*num_steps)
  as inputs and the same columns shifted right by one as targets. Call c
  holds windows [c*steps_per_call, (c+1)*steps_per_call) side by side; the
  last call is padded with zero ids of weight 0 when the epoch does not
  divide evenly, so running the calls in order visits exactly the windows of
  `ptb_producer`, in the same order, with the same state carried across.

  Args:
    raw_data: sequence of int word ids.
    batch_size: rows.
    num_steps: steps per window.
    steps_per_call: windows per call.

  Returns:
    (x, y, w): numpy arrays of shape
    `[num_calls, batch_size, steps_per_call * num_steps]`, int32, int32 and
    float32 (1 for real positions, 0 for padding).

  Raises:
    DataError: epoch_size == 0.
  """
  size = check_epoch_size(len(raw_data), batch_size, num_steps)
  data = np.asarray(raw_data, dtype=np.int32)
  batch_len = len(data) // batch_size
  data = data[:batch_size * batch_len].reshape(batch_size, batch_len)
  span = size * num_steps
  x, y = data[:, :span], data[:, 1:span + 1]
  call_len = steps_per_call * num_steps
  num_calls = -(-size // steps_per_call)
  pad = num_calls * call_len - span
  w = np.ones_like(x, dtype=np.float32)
  if pad:
    x, y = np.pad(x, ((0, 0), (0, pad))), np.pad(y, ((0, 0), (0, pad)))
    w = np.pad(w, ((0, 0), (0, pad)))

  def calls(a):
    return a.reshape(batch_size, num_calls, call_len).transpose(1, 0, 2).copy()

  return calls(x), calls(y), calls(w)


Producer = collections.namedtuple(
    "Producer", ("x", "y", "weights", "position", "num_calls"))


def producer(raw_data, batch_size, num_steps, steps_per_call=1,
             with_weights=None, name=None):
  """Builds the tensors that deliver one call of windows per evaluation.

  The windows are those of chunk_windows. Which call comes next is held in a
  local int64 variable, `position` (calls served so far; call
  `position % num_calls` comes next), so that a run can save where it is and
  resume there.

  Args:
    with_weights: deliver the weights too; by default only when
      steps_per_call > 1 (with one window a call there is no padding).

  Returns:
    A Producer: x, y (int32) and weights (float32, or None), each
    `[batch_size, steps_per_call * num_steps]`; the position variable; the
    number of calls in an epoch.

  Raises:
    DataError: epoch_size == 0.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from ptb.state import local_variable
  x, y, w = chunk_windows(raw_data, batch_size, num_steps, steps_per_call)
  num_calls = x.shape[0]
  if with_weights is None:
    with_weights = steps_per_call > 1
  # The corpus stays in host memory; only one call's slice moves per step.
  with tf.compat.v1.name_scope(name, "PTBProducer"), tf.device("/cpu:0"):
    # A local variable: the position stays in this process even under a
    # parameter-server device setter.
    position = local_variable(tf.constant(0, tf.int64), "position")
    served = position.assign_add(1, read_value=True)
    i = tf.math.floormod(served - 1, num_calls)
    tensors = [tf.gather(tf.constant(a), i)
               for a in ((x, y, w) if with_weights else (x, y))]
  weights = tensors[2] if with_weights else None
  return Producer(tensors[0], tensors[1], weights, position, num_calls)


def ptb_producer(raw_data, batch_size, num_steps, name=None):
  """Iterates over the raw PTB data, one `[batch_size, num_steps]` window a call.

  Args:
    raw_data: sequence of int word ids (one of the outputs of ptb_raw_data).
    batch_size: int, the batch size.
    num_steps: int, the number of unrolled steps.
    name: the name of this operation (optional).

  Returns:
    A pair of int32 tensors (x, y), each `[batch_size, num_steps]`. Each
    evaluation yields the next window, cycling over the epoch forever; y is
    x shifted right by one. Initialise local variables before the first call.

  Raises:
    DataError: epoch_size == 0 for this batch_size and num_steps.
  """
  p = producer(raw_data, batch_size, num_steps, name=name)
  return p.x, p.y


def ptb_chunk_producer(raw_data, batch_size, num_steps, steps_per_call,
                       name=None):
  """Like ptb_producer, with `steps_per_call` consecutive windows per call.

  Evaluation runs many windows per `session.run` this way: the results are
  those of `steps_per_call` calls of ptb_producer, in far fewer calls.

  Returns:
    (x, y, weights): int32, int32 and float32 tensors, each
    `[batch_size, steps_per_call * num_steps]`; weights are 0 on the padding
    of the epoch's last call (see chunk_windows).
  """
  p = producer(raw_data, batch_size, num_steps, steps_per_call,
               with_weights=True, name=name)
  return p.x, p.y, p.weights


def check_vocab_size(words, vocab_size):
  """Raises DataError when the corpus's `words` do not fit `vocab_size`."""
  if words > vocab_size:
    raise DataError(
        "the training corpus has %d distinct words but the config's "
        "vocab_size is %d: raise vocab_size (e.g. --config_overrides="
        "vocab_size=%d) or use a smaller corpus" % (words, vocab_size, words))


def load_data(data_path, vocab_size, rows, num_steps):
  """Reads the corpus and checks that it fits the config, before any work.

  Args:
    data_path: the directory of ptb.{train,valid,test}.txt.
    vocab_size: the config's vocabulary size.
    rows: rows per step of the (train, valid, test) passes, all towers and
      workers together for training.
    num_steps: steps per window of the three passes.

  Returns:
    (train_data, valid_data, test_data) id lists.

  Raises:
    DataError: a file is unusable, the vocabulary is larger than
      `vocab_size`, or a pass would have no window.
  """
  train_data, valid_data, test_data, words = ptb_raw_data(data_path)
  check_vocab_size(words, vocab_size)
  for name, ids, n, steps in zip(
      ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"),
      (train_data, valid_data, test_data), rows, num_steps):
    check_epoch_size(len(ids), n, steps, name)
  return train_data, valid_data, test_data
