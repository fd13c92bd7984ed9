"""The training runtime shared by the recipes: CLI, XLA and precision, checkpoints and resume,
distribution, logs, metrics and plots."""

from keras_tfm.training.checkpoints import CheckpointManager, TrainingDiverged
from keras_tfm.training.cli import FRACTION, POSITIVE, build_model, checkpoint_config, integer, number, recipe_parser
from keras_tfm.training.distribute import distribution_scope, layout_map, use_cpu_devices
from keras_tfm.training.runtime import TrainResult, make_optimizer, plan_steps, run_main, setup, train
