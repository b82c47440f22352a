"""Tests for reader.py."""

import os
import re
import tempfile
from unittest import mock

import numpy as np
import tensorflow as tf

from ptb import data as data_lib
import reader

# The real PTB, found as the program finds it without --data_path and
# without the network ($PTB_DATA_PATH, then the cache); None if neither.
PTB_PATH = data_lib.local_data_dir()
NO_PTB = ("no real PTB here: set PTB_DATA_PATH, or run ptb_word_lm.py once "
          "to fill the cache")


def _write(directory, name, content, mode="w"):
  path = os.path.join(directory, name)
  with open(path, mode) as f:
    f.write(content)
  return path


def _evaluate(tensors, times):
  """Evaluates `tensors` `times` times in a fresh session."""
  with tf.compat.v1.Session() as session:
    session.run(tf.compat.v1.local_variables_initializer())
    return [session.run(tensors) for _ in range(times)]


class PtbReaderTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    self._string_data = "\n".join(
        [" hello there i am",
         " rain as day",
         " want some cheesy puffs ?"])

  def testPtbRawData(self):
    tmpdir = self.get_temp_dir()
    for suffix in "train", "valid", "test":
      _write(tmpdir, "ptb.%s.txt" % suffix, self._string_data)
    train, valid, test, vocab_size = reader.ptb_raw_data(tmpdir)
    self.assertLen(train, 14)  # 12 words, 2 <eos>: the last line has no newline.
    self.assertEqual(vocab_size, 13)
    self.assertEqual(train, valid)
    self.assertEqual(train, test)

  def testEosAndTokens(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      path = _write(tmpdir, "f.txt", "a  b\n\nc\td\n")
      self.assertEqual(reader._read_words(path),
                       ["a", "b", "<eos>", "<eos>", "c", "d", "<eos>"])

  def testVocabularyOrderAndOutOfVocabulary(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      # Counts: b 3, a 2, c 2, <eos> 2; ties are broken by the word itself.
      _write(tmpdir, "ptb.train.txt", "b a c b\nc a b\n")
      _write(tmpdir, "ptb.valid.txt", "a zzz b\n")
      _write(tmpdir, "ptb.test.txt", "qqq c\n")
      train, valid, test, vocab_size = reader.ptb_raw_data(tmpdir)
    self.assertEqual(vocab_size, 4)
    # b (count 3) is 0; then the count-2 words by spelling: <eos>, a, c.
    self.assertEqual(train, [0, 2, 3, 0, 1, 3, 2, 0, 1])
    self.assertEqual(valid, [2, 0, 1])  # "zzz" dropped.
    self.assertEqual(test, [3, 1])      # "qqq" dropped.

  def testPtbProducer(self):
    raw_data = [4, 3, 2, 1, 0, 5, 6, 1, 1, 1, 1, 0, 3, 4, 1]
    batch_size = 3
    num_steps = 2
    with tf.Graph().as_default():
      x, y = reader.ptb_producer(raw_data, batch_size, num_steps)
      (xval, yval), (xval2, yval2), (xval3, yval3) = _evaluate([x, y], 3)
    self.assertAllEqual(xval, [[4, 3], [5, 6], [1, 0]])
    self.assertAllEqual(yval, [[3, 2], [6, 1], [0, 3]])
    self.assertAllEqual(xval2, [[2, 1], [1, 1], [3, 4]])
    self.assertAllEqual(yval2, [[1, 0], [1, 1], [4, 1]])
    # epoch_size is 2: the third call starts the next pass.
    self.assertAllEqual(xval3, xval)
    self.assertAllEqual(yval3, yval)
    self.assertEqual(x.dtype, tf.int32)
    self.assertEqual(x.shape.as_list(), [3, 2])

  def testChunkProducerVisitsTheSameWindows(self):
    raw_data = list(np.random.RandomState(0).randint(0, 50, size=203))
    batch_size, num_steps, per_call = 4, 3, 5
    size = reader.epoch_size(len(raw_data), batch_size, num_steps)
    self.assertEqual(size, 16)
    with tf.Graph().as_default():
      x, y = reader.ptb_producer(raw_data, batch_size, num_steps)
      windows = _evaluate([x, y], size)
    with tf.Graph().as_default():
      cx, cy, cw = reader.ptb_chunk_producer(raw_data, batch_size, num_steps,
                                             per_call)
      calls = _evaluate([cx, cy, cw], 4)
    self.assertEqual(cx.shape.as_list(), [4, 15])
    got_x = np.concatenate([c[0] for c in calls], axis=1)
    got_y = np.concatenate([c[1] for c in calls], axis=1)
    got_w = np.concatenate([c[2] for c in calls], axis=1)
    span = size * num_steps
    self.assertAllEqual(got_x[:, :span], np.concatenate([w[0] for w in windows], 1))
    self.assertAllEqual(got_y[:, :span], np.concatenate([w[1] for w in windows], 1))
    self.assertAllEqual(got_w[:, :span], np.ones([4, span]))
    self.assertAllEqual(got_w[:, span:], np.zeros([4, 20 * 3 - span]))

  def testEpochSizeZero(self):
    with self.assertRaisesRegex(reader.DataError,
                                "epoch_size == 0, decrease batch_size or num_steps"):
      reader.ptb_producer([1, 2, 3, 4, 5], batch_size=3, num_steps=2)

  def testMissingFile(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      _write(tmpdir, "ptb.train.txt", "a b\n")
      _write(tmpdir, "ptb.test.txt", "a b\n")
      with self.assertRaisesRegex(reader.DataError,
                                  "ptb.valid.txt is missing.*simple-examples"):
        reader.ptb_raw_data(tmpdir)

  def testDataPathIsAFile(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      path = _write(tmpdir, "x.txt", "a")
      with self.assertRaisesRegex(reader.DataError, "is a file"):
        reader.ptb_raw_data(path)

  def testDataPathThatDoesNotExist(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      path = os.path.join(tmpdir, "nowhere")
      with self.assertRaisesRegex(
          reader.DataError, r"^--data_path=%s does not exist: give the "
          r"directory that holds ptb\.train\.txt, ptb\.valid\.txt, "
          r"ptb\.test\.txt \(for example simple-examples/data from http"
          % re.escape(path)):
        reader.ptb_raw_data(path)

  def testFileThatIsADirectory(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      for name in reader.FILE_NAMES:
        _write(tmpdir, name, "a b\n")
      valid = os.path.join(tmpdir, "ptb.valid.txt")
      os.remove(valid)
      os.mkdir(valid)
      with self.assertRaisesRegex(
          reader.DataError, r"^%s is a directory, not a text file$"
          % re.escape(valid)):
        reader.ptb_raw_data(tmpdir)

  def testFileThatCannotBeRead(self):
    # Permissions do not stop root, who may run the tests: the refusal is
    # the operating system's error from open().
    denied = PermissionError(13, "Permission denied")
    with tempfile.TemporaryDirectory() as tmpdir:
      path = _write(tmpdir, "f.txt", "a")
      with mock.patch.object(reader, "open", create=True,
                             side_effect=denied), self.assertRaisesRegex(
                                 reader.DataError, r"^cannot read %s: "
                                 r"Permission denied$" % re.escape(path)):
        reader._read_words(path)

  def testNotUtf8NamesFileAndOffset(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      path = _write(tmpdir, "f.txt", b"abc \xff def", mode="wb")
      with self.assertRaisesRegex(
          reader.DataError, "f.txt is not UTF-8 text: invalid byte 0xff at "
          "byte offset 4"):
        reader._read_words(path)

  def testEmptyFile(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      path = _write(tmpdir, "g.txt", "")
      with self.assertRaisesRegex(reader.DataError, "g.txt is empty"):
        reader._read_words(path)
      # Line ends alone are no words: a file of blank lines trained to a
      # perplexity of 1 on its one "word".
      path = _write(tmpdir, "f.txt", " \n" + "\n" * 2999)
      with self.assertRaisesRegex(reader.DataError,
                                  "f.txt holds no words, only 3000 line ends"):
        reader._read_words(path)
      self.assertEqual(reader._read_words(_write(tmpdir, "h.txt", "\n a\n")),
                       ["<eos>", "a", "<eos>"])

  def testByteOrderMarkIsNoWord(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      plain = os.path.join(tmpdir, "plain")
      marked = os.path.join(tmpdir, "marked")
      for d in (plain, marked):
        os.mkdir(d)
      for name in ("train", "valid", "test"):
        text = " the cat sat \n on the mat \n"
        _write(plain, "ptb.%s.txt" % name, text.encode(), mode="wb")
        _write(marked, "ptb.%s.txt" % name, b"\xef\xbb\xbf" + text.encode(),
               mode="wb")
      self.assertEqual(reader.ptb_raw_data(marked), reader.ptb_raw_data(plain))
      self.assertEqual(reader.ptb_raw_data(plain)[3], 6)

  def testLoadDataChecksTheCorpusAgainstTheConfig(self):
    with tempfile.TemporaryDirectory() as tmpdir:
      # 5 distinct words (<eos> included); 50, 6 and 4 ids.
      _write(tmpdir, "ptb.train.txt", "a b c d\n" * 10)
      _write(tmpdir, "ptb.valid.txt", "a b\n" * 2)
      _write(tmpdir, "ptb.test.txt", "c\n" * 2)
      self.assertEqual(reader.load_data(tmpdir, 5, (2, 1, 1), (2, 1, 1)),
                       reader.ptb_raw_data(tmpdir)[:3])
      with self.assertRaisesRegex(
          reader.DataError, r"^the training corpus has 5 distinct words but "
          r"the config's vocab_size is 4: raise vocab_size \(e\.g\. "
          r"--config_overrides=vocab_size=5\) or use a smaller corpus$"):
        reader.load_data(tmpdir, 4, (2, 1, 1), (2, 1, 1))
      # Each pass with its own rows and steps; the error names the file.
      with self.assertRaisesRegex(
          reader.DataError, r"^epoch_size == 0, decrease batch_size or "
          r"num_steps: ptb\.valid\.txt has 6 words, too few for "
          r"batch_size=4 and num_steps=2 \(it needs at least 12\)$"):
        reader.load_data(tmpdir, 5, (2, 4, 1), (2, 2, 1))

  def testRealPtb(self):
    if PTB_PATH is None:
      self.skipTest(NO_PTB)
    train, valid, test, vocab_size = reader.ptb_raw_data(PTB_PATH)
    self.assertEqual(vocab_size, 10000)
    self.assertEqual((len(train), len(valid), len(test)),
                     (929589, 73760, 82430))
    word_to_id = reader._build_vocab(
        reader._read_words(os.path.join(PTB_PATH, "ptb.train.txt")))
    for word, expected in (("the", 0), ("<unk>", 1), ("<eos>", 2), ("N", 3),
                           ("of", 4)):
      self.assertEqual(word_to_id[word], expected)
    self.assertEqual(reader.epoch_size(len(train), 20, 20), 2323)
    self.assertEqual(reader.epoch_size(len(valid), 20, 20), 184)
    self.assertEqual(reader.epoch_size(len(train), 20, 35), 1327)
    self.assertEqual(reader.epoch_size(len(valid), 20, 35), 105)
    self.assertEqual(reader.epoch_size(len(test), 1, 1), 82429)


if __name__ == "__main__":
  tf.test.main()
