"""The README and docs/design.md against the code they describe.

Every flag the README's tables name exists with the default they give;
every file they link or name exists; every module of ptb/ is in
design.md's module table.
"""

import os
import re

import tensorflow as tf

from ptb.testing import HERE
import ptb_word_lm

_ROW = re.compile(r"^\| (.+?) \| (.+?) \|")


def _read(path):
  with open(os.path.join(HERE, path), encoding="utf-8") as f:
    return f.read()


def _default(text):
  """The value a README cell gives as a default."""
  text = text.strip().strip("`")
  if text.startswith(("none", "$")):
    return None
  if text in ("false", "true"):
    return text == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def flag_rows(readme):
  """(flag, README's default) of each flag row of the README's tables."""
  rows = []
  for line in readme.splitlines():
    match = _ROW.match(line)
    if not match or not match.group(1).startswith("`--"):
      continue
    names = re.findall(r"`--(\w+)", match.group(1))
    defaults = match.group(2).split(", ")
    if len(defaults) != len(names):
      defaults = [match.group(2)] * len(names)  # one cell for all
    rows += list(zip(names, defaults))
  return rows


class ReadmeTest(tf.test.TestCase):

  def testEveryFlagExistsWithItsDefault(self):
    rows = flag_rows(_read("README.md"))
    self.assertGreater(len(rows), 20)
    flags = ptb_word_lm.FLAGS
    for name, default in rows:
      with self.subTest(flag=name):
        self.assertIn(name, flags)
        self.assertEqual(flags[name].default, _default(default))

  def testEveryFileItNamesExists(self):
    readme = _read("README.md")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    files_table = readme[readme.index("## Files"):readme.index("Docs:")]
    named = re.findall(r"^\| `([\w./-]+)`", files_table, re.M)
    named += [n for cell in re.findall(r"^\| (`[^|]+`) \|", files_table, re.M)
              for n in re.findall(r"`([\w./-]+)`", cell)]
    for path in set(links + named):
      if path.startswith("http"):
        continue
      with self.subTest(path=path):
        self.assertTrue(os.path.exists(os.path.join(HERE, path)), path)


class DesignTest(tf.test.TestCase):

  def testEveryModuleIsInTheModuleTable(self):
    listed = set(re.findall(r"^\| \[`ptb/(\w+)\.py`\]", _read(
        "docs/design.md"), re.M))
    modules = {f[:-3] for f in os.listdir(os.path.join(HERE, "ptb"))
               if f.endswith(".py") and not f.endswith("_test.py")
               and f != "__init__.py"}
    self.assertEqual(sorted(modules - listed), [])
    self.assertEqual(sorted(listed - modules), [])


if __name__ == "__main__":
  tf.test.main()
