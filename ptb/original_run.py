"""The 2018 original, run beside the port: its virtualenv, its edited copy.

The original tutorial (tensorflow/models, tutorials/rnn/ptb, March 2018)
needs TensorFlow 1.x and its contrib modules: TensorFlow 1.5.1, the version of the
how-to this project follows, in a Python 3.6 virtualenv with the packages
of its time. Its configs are classes edited in place, so a run of another
config is a copy of its files whose class is edited, as a user would edit
it; the edit is shown as a diff, so that nothing else can have changed.
"""

import difflib
import glob
import os
import re
import shutil
import subprocess
import sys

from ptb.errors import UserError

FILES = ("ptb_word_lm.py", "reader.py", "util.py")
CLASSES = {"small": "SmallConfig", "medium": "MediumConfig",
           "large": "LargeConfig", "test": "TestConfig"}
# TensorFlow 1.5.1 (CPU) and the versions of its time that it runs with;
# it has wheels for CPython 3.3 to 3.6 only.
PACKAGES = ("tensorflow==1.5.1", "numpy==1.14.5", "protobuf==3.5.1",
            "six==1.11.0", "absl-py==0.1.10", "tensorflow-tensorboard==1.5.1",
            "bleach==1.5.0", "html5lib==0.9999999", "Markdown==2.6.11",
            "Werkzeug==0.14.1", "wheel==0.30.0")
TENSORFLOW_VERSION = "1.5.1"
# TensorFlow 1.5.1 allocates through the jemalloc 4 built into it, which
# hands freed pages back to the kernel as it goes: each step of a large
# model faults its big blocks in again, and the kernel zeroing them takes
# most of the CPU time. This, its own option (JEMALLOC_MALLOC_CONF: the
# system's MALLOC_CONF and LD_PRELOAD do not reach it), keeps them; the
# arithmetic is the same (docs/original.md).
KEEP_PAGES = {"JEMALLOC_MALLOC_CONF": "lg_dirty_mult:-1"}


def check_files(directory):
  """Refuses a --original directory without the tutorial's three files."""
  if not directory:
    raise UserError("give --original=DIR, a directory with the 2018 "
                    "tutorial's %s" % ", ".join(FILES), exit_code=2)
  missing = [f for f in FILES if not os.path.isfile(os.path.join(directory,
                                                                 f))]
  if missing:
    raise UserError("--original=%s: no %s there (it needs the 2018 "
                    "tutorial's %s)" % (directory, " or ".join(missing),
                                        ", ".join(FILES)), exit_code=2)
  with open(os.path.join(directory, "ptb_word_lm.py")) as f:
    source = f.read()
  if "BasicLSTMCell" not in source or "class LargeConfig" not in source:
    raise UserError("--original=%s: its ptb_word_lm.py is not the 2018 "
                    "tutorial (no LargeConfig with a BasicLSTMCell)"
                    % directory, exit_code=2)


def find_python36():
  """A Python 3.6 interpreter: $PYTHON36, python3.6 on PATH, or pyenv's."""
  candidates = [os.environ.get("PYTHON36"), shutil.which("python3.6")]
  root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
  candidates += sorted(glob.glob(os.path.join(root, "versions", "3.6*", "bin",
                                              "python")))
  for python in filter(None, candidates):
    if _runs(python, "import sys; sys.exit(sys.version_info[:2] != (3, 6))"):
      return python
  return None


def _runs(python, code):
  """Whether `python -c code` exits 0."""
  try:
    return subprocess.run([python, "-c", code], capture_output=True,
                          check=False, timeout=120).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def venv_python(venv):
  return os.path.join(venv, "bin", "python")


def has_tensorflow(venv):
  """Whether `venv` runs TensorFlow 1.5.1."""
  return _runs(venv_python(venv),
               "import tensorflow as tf; assert tf.__version__ == %r"
               % TENSORFLOW_VERSION)


def ensure_venv(venv):
  """Takes the virtualenv at `venv`, or makes it there if it is missing.

  Returns:
    Its python.

  Raises:
    UserError: `venv` exists without TensorFlow 1.5.1, no Python 3.6 is
      found to make it, or the install fails.
  """
  if os.path.exists(venv):
    if not has_tensorflow(venv):
      raise UserError("--original_venv=%s exists but does not run TensorFlow "
                      "%s; remove it to have it made again"
                      % (venv, TENSORFLOW_VERSION))
    return venv_python(venv)
  python = find_python36()
  if python is None:
    raise UserError("making the original's virtualenv needs a Python 3.6 "
                    "(TensorFlow %s has no wheels for later ones): set "
                    "PYTHON36=/path/to/python3.6" % TENSORFLOW_VERSION)
  print("Making the original's virtualenv at %s with %s (TensorFlow %s)"
        % (venv, python, TENSORFLOW_VERSION), file=sys.stderr, flush=True)
  steps = ([python, "-m", "venv", venv],
           [venv_python(venv), "-m", "pip", "install", "--quiet",
            "--only-binary", "tensorflow,numpy,protobuf"] + list(PACKAGES))
  for command in steps:
    proc = subprocess.run(command, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
      shutil.rmtree(venv, ignore_errors=True)
      said = (proc.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
      raise UserError("making the original's virtualenv failed: `%s` exited "
                      "with status %d: %s" % (" ".join(command[:4]),
                                              proc.returncode, said))
  return venv_python(venv)


def edit_class(source, class_name, values):
  """`source` with the fields of class `class_name` set to `values`.

  Each field's line `  name = ...` in the class becomes `  name = repr`,
  as a user edits a config in place.

  Args:
    source: the text of the original's ptb_word_lm.py.
    class_name: "LargeConfig", say.
    values: {field: int or float}.

  Raises:
    UserError: a field the class does not have.
  """
  start = source.index("class %s(object):" % class_name)
  end = source.find("\nclass ", start + 1)
  end = len(source) if end < 0 else end
  body = source[start:end]
  for name, value in sorted(values.items()):
    body, count = re.subn(r"(?m)^(\s+%s = ).*$" % re.escape(name),
                          lambda m, v=value: m.group(1) + repr(v), body,
                          count=1)
    if not count:
      raise UserError("the original's %s has no field %s" % (class_name,
                                                              name),
                      exit_code=2)
  return source[:start] + body + source[end:]


def write_copy(directory, destination, model, values):
  """Copies the original into `destination` with its config class edited.

  Returns:
    The edit, as a unified diff of ptb_word_lm.py ("" when none).
  """
  os.makedirs(destination, exist_ok=True)
  for name in FILES[1:]:
    shutil.copy(os.path.join(directory, name), destination)
  with open(os.path.join(directory, FILES[0])) as f:
    source = f.read()
  edited = edit_class(source, CLASSES[model], values)
  with open(os.path.join(destination, FILES[0]), "w") as f:
    f.write(edited)
  return "".join(difflib.unified_diff(
      source.splitlines(True), edited.splitlines(True),
      "original/" + FILES[0], "edited/" + FILES[0]))


def environment(keep_pages, base):
  """The original's environment: `base`, with KEEP_PAGES if `keep_pages`
  and `base` sets no jemalloc options of its own."""
  env = dict(base)
  if keep_pages:
    for name, value in KEEP_PAGES.items():
      env.setdefault(name, value)
  return env


def command(python, copy_dir, data_path, model, save_path):
  """The original's command line on the CPU, restoring from `save_path`."""
  return [python, "-u", os.path.join(copy_dir, FILES[0]),
          "--data_path=" + data_path, "--model=" + model, "--num_gpus=0",
          "--save_path=" + save_path]
