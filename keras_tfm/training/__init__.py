"""The training runtime shared by the recipes: settings, XLA and precision, checkpoints and resume,
distribution, logs, metrics and plots; and the command line over it."""

from keras_tfm.errors import CheckpointError, DataError, InputError
from keras_tfm.training.checkpoints import CheckpointManager, TrainingDiverged
from keras_tfm.training.cli import (
    FRACTION,
    POSITIVE,
    RecipeParser,
    build_model,
    checkpoint_config,
    integer,
    number,
    recipe_parser,
    recipe_settings,
    run_main,
    shapes_flags,
    training_config,
)
from keras_tfm.training.config import HuggingFaceCheckpoint, TrainingConfig
from keras_tfm.training.distribute import (
    ProcessLost,
    distribution_scope,
    initialize_processes,
    is_writer,
    layout_map,
    local_rows,
    log,
    processes,
    use_cpu_devices,
)
from keras_tfm.training.fitting import make_optimizer, plan_steps, setup
from keras_tfm.training.runtime import TrainResult, train
from keras_tfm.training.samples import PrintSamples, text_sampler
