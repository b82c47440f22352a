"""The flags this port adds to the tutorial's.

ptb_word_lm.py defines the tutorial's own flags (and --config_overrides);
importing this module defines the rest: devices and threads, evaluation,
seeding, starting weights, bfloat16 products, the plan, checkpoints, the memory log
and summary, and the cluster. They are read only by the entry points
(ptb_word_lm.main, benchmark.py).
"""

from absl import flags

flags.DEFINE_integer(
    "cpu_towers", 1,
    "With --num_gpus=0: train with this many towers on virtual CPU devices "
    "(tests the multi-tower path without GPUs; it is not faster).")
flags.DEFINE_integer("intra_op_threads", 0,
                     "Threads inside one op; 0 lets TensorFlow choose.")
flags.DEFINE_integer("inter_op_threads", 0,
                     "Ops run in parallel; 0 lets TensorFlow choose.")
flags.DEFINE_integer(
    "eval_unroll", 20,
    "About this many time steps per session call of validation and test: "
    "max(1, eval_unroll // num_steps) consecutive windows, unrolled in the "
    "graph (the same perplexities as one window a call).")
flags.DEFINE_integer(
    "seed", None,
    "Graph-level random seed, for reproducible initialisation and dropout; "
    "unset, every run draws its own (as the original did).")
flags.DEFINE_bool(
    "train_from_zero_state", False,
    "Start every training step from a zero LSTM state, as the original did "
    "with --num_gpus=0 (it fed no state there); validation and test still "
    "carry their state from step to step.")
flags.DEFINE_string(
    "init_from", None,
    "Start from the weights of this checkpoint (a prefix, or a directory's "
    "latest): this port's, or the 2018 original's (its BASIC or BLOCK "
    "names). A resumed --save_path takes precedence.")
flags.DEFINE_bool(
    "eval_only", False,
    "With --init_from: train nothing; print the validation and test "
    "perplexities of its weights.")
flags.DEFINE_float(
    "original_summary_secs", 0.0,
    "Skip one window of the training and one of the validation input at "
    "the start and every this many seconds, as the original's Supervisor "
    "did when given --save_path (120 s; ptb/summary_thread.py); 0: off. "
    "Needs --eval_unroll=1.")
flags.DEFINE_list(
    "original_summary_calls", None,
    "Instead of --original_summary_secs: take those windows after these "
    "many session calls of the run (0: before the first; a count listed "
    "twice takes twice), where the original's own run took them "
    "(compare_original.py reads them from its event files).")
flags.DEFINE_integer(
    "original_norm_threads", 0,
    "Sum the gradients' clipping norm as TensorFlow 1.5.1 summed it in "
    "float32 on a machine of this many cores (the original's l2_loss; "
    "ptb/original_norm.py), to follow the original step for step "
    "(compare_original.py); 0: the exact sum.")
flags.DEFINE_bool(
    "use_bf16", False,
    "Run the matrix products in bfloat16 (float32 accumulation; weights, "
    "update, cell state and loss in float32). Refused on a CPU without "
    "AVX512_BF16 or AMX, where it would be slower than float32.")
flags.DEFINE_bool(
    "force_bf16", False,
    "With --use_bf16: run it even on a CPU without bfloat16 units (slow; "
    "for tests).")
flags.DEFINE_enum(
    "plan", "measure", ["measure", "estimate"],
    "How each product's path is chosen: measure times the candidates at "
    "the config's shapes on the first run of a config on this machine and "
    "keeps the choice (ptb/planner.py); estimate uses the rules of "
    "ptb/plan.py.")
flags.DEFINE_integer(
    "save_every_steps", 0,
    "With --save_path, also save a checkpoint every this many training "
    "steps (0: only at the end of every epoch).")
flags.DEFINE_string(
    "memory_log", None,
    "Write a CSV of the process's RSS (and GPU memory) over time here, with "
    "the phase, epoch and step of the run.")
flags.DEFINE_float("memory_interval", 2.0,
                   "Seconds between two --memory_log samples.")
flags.DEFINE_string(
    "summary_json", None,
    "Write a JSON summary of the run here (rewritten after every epoch).")
flags.DEFINE_string("job_name", None,
                    "Multi-process training: this task's job, ps or worker.")
flags.DEFINE_integer("task_index", 0, "Index of this task within its job.")
flags.DEFINE_string("ps_hosts", None,
                    "Comma-separated host:port of the parameter servers.")
flags.DEFINE_string("worker_hosts", None,
                    "Comma-separated host:port of the workers (the first is "
                    "the chief).")
flags.DEFINE_float(
    "cluster_timeout", 300.0,
    "Seconds a task waits for the others (to start, to make progress) "
    "before it stops with an error instead of hanging.")
