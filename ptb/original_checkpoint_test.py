"""Tests of ptb/original_checkpoint.py: the original's names, both ways."""

import os
import re
import tempfile

import numpy as np
import tensorflow as tf

from ptb import original_checkpoint as oc
from ptb import testing
from ptb.errors import UserError
from ptb.params import create_params
import ptb_word_lm_testing


def _values(text):
  """{"Valid"|"Test"|("Epoch N Valid"...): perplexity} of a run's stdout."""
  return {m.group(1): float(m.group(2)) for m in re.finditer(
      r"^(.*)Perplexity: (\S+)$", text, re.M)}


def _variables(config):
  """The weight variables of `config`, in a graph of their own."""
  with tf.Graph().as_default(), tf.compat.v1.variable_scope("Model"):
    return create_params(config, tf.float32).as_list()


class NamesTest(tf.test.TestCase):

  def testOriginalNames(self):
    self.assertEqual(oc.original_name("Model/RNN/cell_1/kernel"),
                     "Model/RNN/multi_rnn_cell/cell_1/basic_lstm_cell/kernel")
    self.assertEqual(oc.original_name("Model/RNN/cell_0/bias", oc.BLOCK_CELL),
                     "Model/RNN/multi_rnn_cell/cell_0/lstm_cell/bias")
    self.assertEqual(oc.original_name("Model/softmax_w"), "Model/softmax_w")

  def testInitialValuesAreSeededAndAsARunStartsThem(self):
    config = testing.TinyConfig()
    first, again = oc.initial_values(config, 7), oc.initial_values(config, 7)
    other = oc.initial_values(config, 8)
    self.assertEqual(sorted(first), [
        "Model/RNN/cell_0/bias", "Model/RNN/cell_0/kernel",
        "Model/RNN/cell_1/bias", "Model/RNN/cell_1/kernel",
        "Model/embedding", "Model/softmax_b", "Model/softmax_w"])
    for name, value in first.items():
      self.assertAllEqual(value, again[name])
      if name.endswith("/bias"):
        self.assertAllEqual(value, np.zeros_like(value))
      else:
        self.assertFalse(np.array_equal(value, other[name]), name)
        self.assertLessEqual(np.abs(value).max(), config.init_scale)
    self.assertEqual(first["Model/RNN/cell_0/kernel"].shape, (16, 32))

  def testWrittenAsTheOriginalNamesThemAndReadBack(self):
    weights = oc.initial_values(testing.TinyConfig(), 3)
    with tempfile.TemporaryDirectory() as tmp:
      for cell in (oc.BASIC_CELL, oc.BLOCK_CELL):
        ckpt = oc.write(os.path.join(tmp, cell, "model.ckpt-0"), weights,
                        cell=cell, learning_rate=0.5)
        saved = tf.train.load_checkpoint(ckpt)
        self.assertEqual(sorted(saved.get_variable_to_shape_map()), sorted(
            [oc.original_name(n, cell) for n in weights]
            + [oc.LEARNING_RATE, oc.GLOBAL_STEP]))
        self.assertEqual(saved.get_tensor(oc.LEARNING_RATE), 0.5)
        # A directory names its latest checkpoint, as the Supervisor reads it.
        self.assertEqual(oc.resolve(os.path.dirname(ckpt)), ckpt)
        read = oc.read(ckpt)
        self.assertEqual(sorted(read), sorted(weights))
        for name, value in weights.items():
          self.assertAllEqual(read[name], value)

  def testRefusals(self):
    config = testing.TinyConfig()
    weights = oc.initial_values(config, 3)
    with tempfile.TemporaryDirectory() as tmp:
      with self.assertRaisesRegex(UserError, "no checkpoint in"):
        oc.resolve(tmp)
      with self.assertRaisesRegex(UserError, r"no checkpoint .*nothing\.index"):
        oc.resolve(os.path.join(tmp, "nothing"))
      ckpt = oc.write(os.path.join(tmp, "model.ckpt-0"), weights)
      testing.drop_variables(ckpt, [oc.original_name(
          "Model/RNN/cell_1/bias")])
      with self.assertRaisesRegex(UserError, "holds no weight "
                                  "Model/RNN/cell_1/bias"):
        oc.init_from(ckpt, _variables(config))
      weights["Model/RNN/cell_1/bias"] = np.zeros(32, np.float32)
      oc.write(ckpt, weights)
      # Checked against the config before any work (main's check_flags).
      with self.assertRaisesRegex(UserError, r"holds Model/\S+ as float32; "
                                  r"this run's is float16"):
        oc.check_flags(ckpt, False, None, config, tf.float16)
      self.assertEqual(oc.check_flags(os.path.dirname(ckpt), True, None,
                                      config), ckpt)
      config.hidden_size = 9
      with self.assertRaisesRegex(UserError, r"Model/embedding of shape "
                                  r"\[30, 8\]; this config's is \[30, 9\]"):
        oc.init_from(ckpt, _variables(config))
    self.assertRaisesRegex(UserError, "give --init_from", oc.check_flags,
                           None, True, None)
    self.assertRaisesRegex(UserError, "drop --save_path", oc.check_flags,
                           "x", True, "y")


class EvaluateTest(tf.test.TestCase):
  """A checkpoint, the port's or renamed as the original's, evaluated."""

  def testEvalOnlyGivesTheRunsOwnPerplexitiesUnderEitherName(self):
    with tempfile.TemporaryDirectory() as tmp:
      data = testing.make_structured_corpus(tmp)
      save = os.path.join(tmp, "save")
      out, err, stop = ptb_word_lm_testing.run_in_process(
          testing.learning_args(data, "max_max_epoch=1") +
          ["--save_path=" + save])
      self.assertIsNone(stop, err)
      trained = _values(out)
      original = oc.write(os.path.join(tmp, "original", "model.ckpt-9"),
                          oc.read(tf.train.latest_checkpoint(save)))
      for source in (save, original):
        with self.subTest(source=source):
          out, err, stop = ptb_word_lm_testing.run_in_process(
              testing.learning_args(data) + ["--init_from=" + source,
                                             "--eval_only"])
          self.assertIsNone(stop, err)
          self.assertNotIn("Epoch:", out)
          self.assertEqual(_values(out), {
              "Valid ": trained["Epoch: 1 Valid "],
              "Test ": trained["Test "]})
      # Trained from the checkpoint's weights: the first cost is theirs.
      out, err, stop = ptb_word_lm_testing.run_in_process(
          testing.learning_args(data, "max_max_epoch=1,learning_rate=1e-9") +
          ["--init_from=" + original])
      self.assertIsNone(stop, err)
      self.assertAllClose(_values(out)["Test "], trained["Test "], rtol=1e-4)


if __name__ == "__main__":
  tf.test.main()
