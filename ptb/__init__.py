"""The internals of ptb_word_lm.py, one module per mechanism.

lstm            the LSTM's forward and backward passes in every mode, the stack
wavefront       the wavefront's time chunks and their size
state           the LSTM state tuple and its packing, local variables
softmax         the softmax loss with its hand-written gradient
low_rank_update gradients of few rows applied from their factors
dropout         dropout as explicit masks
kernels         the C++ kernels (kernels.cc): build, cache, load
config          rnn modes (AUTO), --config_overrides, value checks
devices         device flags against the machine, session devices
checkpoint      progress variables and the checkpointer
outputs         outputs checked before work starts; the save_path lock
data            where the PTB comes from; the checked download and cache
training        the pieces around main's loop: resume, checkpoints, epochs
watch           after every session call: signals, divergence, saves
summary         the --summary_json file, continued by a resumed run
monitor         RSS, the memory log, atomic JSON files, library pages
onednn          TensorFlow's oneDNN matmuls on every x86 CPU
cluster         multi-process training on TensorFlow's runtime
errors          the one-line errors that end a run
testing         helpers of the tests
"""
