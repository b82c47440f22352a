"""The device flags checked against the machine, and the session's devices."""

import tensorflow as tf

from ptb.config import CUDNN
from ptb.config import check_flag_ranges
from ptb.errors import UserError


def tower_devices(num_gpus, num_cpu_towers=1):
  """Lists the devices that the training towers run on.

  Args:
    num_gpus: GPUs to train on; 0 trains on the CPU.
    num_cpu_towers: with num_gpus == 0, how many towers to place on virtual CPU
      devices (the session must then be created with
      `ConfigProto(device_count={"CPU": num_cpu_towers})`). Several CPU towers
      compute nothing faster; they test the multi-tower code without GPUs.

  Returns:
    A list of device strings, one per tower.
  """
  if num_gpus > 0:
    return ["/gpu:%d" % i for i in range(num_gpus)]
  return ["/cpu:%d" % i for i in range(num_cpu_towers)]


def check_devices(num_gpus, rnn_mode, cpu_towers):
  """Checks the device flags against the machine; returns tower devices.

  The flags' ranges are config.FLAG_RANGES': checked here too for the
  entry points that do not check every flag (benchmark.py).
  """
  check_flag_ranges({"num_gpus": num_gpus, "cpu_towers": cpu_towers})
  # Probing for GPUs costs a CUDA initialisation (and its log lines), so the
  # CPU path does not ask.
  present = len(tf.config.list_physical_devices("GPU")) if num_gpus else 0
  if num_gpus > present:
    raise UserError(
        "--num_gpus=%d but this machine has %d GPU%s visible to TensorFlow; "
        "use --num_gpus=0 to train on the CPU"
        % (num_gpus, present, "" if present == 1 else "s"))
  if rnn_mode == CUDNN and num_gpus == 0:
    raise UserError("--rnn_mode=CUDNN needs a GPU (cuDNN) and --num_gpus >= 1; "
                    "on the CPU use BASIC or BLOCK")
  return tower_devices(num_gpus, cpu_towers)


def session_config(devices, intra_op_threads, inter_op_threads):
  cpu_count = sum(d.startswith("/cpu") for d in devices)
  return tf.compat.v1.ConfigProto(
      device_count={"CPU": max(1, cpu_count)},
      intra_op_parallelism_threads=intra_op_threads,
      inter_op_parallelism_threads=inter_op_threads,
      allow_soft_placement=False)
