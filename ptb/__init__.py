"""The internals of ptb_word_lm.py, one module per mechanism.

plan               every choice a step makes, made once per run; thresholds
lstm               the LSTM's forward and backward passes in every mode, the
                   stack
wavefront          the wavefront's time chunks
params             the model's weights by name, and their variables
state              the LSTM state tuple and its packing, local variables
softmax            the softmax loss with its hand-written gradient
low_rank_update    gradients of few rows carried and applied as factors
transposed_product input gradients of few rows, a @ w^T as (w @ a^T)^T
bfloat16           --use_bf16: the products' operands in bfloat16
tower              one tower's graph, from word ids to its cost
dropout            dropout as explicit masks
kernels            the C++ kernels (kernels.cc): build, cache, load
extra_flags        the flags this port adds to the tutorial's
config             rnn modes (AUTO), the config fields' kinds,
                   --config_overrides, value checks
devices            device flags against the machine, session devices
checkpoint         progress variables and the checkpointer
resume             what a resume may change from its checkpoint's config
outputs            outputs checked before work starts; the save_path lock
data               where the PTB comes from; the checked download and cache
training           the pieces around main's loop: resume, checkpoints, epochs
watch              after every session call: signals, divergence, saves
summary            the --summary_json file, continued by a resumed run
tensorboard        the TensorBoard scalars, written by the thread that adds
                   them
monitor            RSS, the memory log, atomic JSON files, library pages
machine            the machine's limits measured in-process (FMA and
                   bfloat16 peaks, matmul rate, memory bandwidth)
roofline           FLOPs and bytes a word needs, the roofs, their picture
onednn             TensorFlow's oneDNN matmuls on every x86 CPU
startup_log        TensorFlow's C++ start-up lines, held to
                   TF_CPP_MIN_LOG_LEVEL
cluster            multi-process training on TensorFlow's runtime
original_checkpoint the 2018 original's checkpoint names, written and read;
                   --init_from
original_run       the original's virtualenv and its copy with a config
                   class edited in place
summary_thread     the windows the original's Supervisor summary thread
                   took (--original_summary_secs)
curves             the perplexity lines of a run, read as it prints them
errors             the one-line errors that end a run
testing            helpers of the tests
"""
