"""Recording a run: its evaluation in `metrics.json`, `learning_curves.png` from `log.csv`, and the
trained model written for transformers and peft users where they can use it."""

from __future__ import annotations

import csv
import importlib.util
import json
import os

import keras

from keras_tfm.compat import sublayers
from keras_tfm.models.base import ZooModel
from keras_tfm.training.config import HuggingFaceCheckpoint, TrainingConfig
from keras_tfm.training.distribute import alone, log


def write_records(
    config: TrainingConfig,
    model,
    record: dict,
    lora_rank,
    huggingface: HuggingFaceCheckpoint | None,
    tokenizer,
    labels,
    image_preprocessing,
    settings: dict | None = None,
) -> dict:
    """Writes the exports, `metrics.json` and the learning curves (titled with the model and the data
    named in `settings`, the recipe's); returns the history of `log.csv` (process 0 only)."""
    with alone():
        record.update(export(config, model, lora_rank, huggingface, tokenizer, labels, image_preprocessing))
    with open(os.path.join(config.output_dir, "metrics.json"), "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
    history = read_log(os.path.join(config.output_dir, "log.csv"))
    if history and importlib.util.find_spec("matplotlib") is None:  # an install without the recipes' extra
        log("No learning_curves.png: drawing it needs matplotlib (pip install 'keras_tfm[recipes]').")
    elif history:
        from keras_tfm.viz import plot_learning_curves

        title = f"{record['model']} on {data_name(settings or {})}"
        plot_learning_curves(history, os.path.join(config.output_dir, "learning_curves.png"), title=title)
    log("Metrics: " + json.dumps(record))
    return history


def data_name(settings: dict) -> str:
    """The data a run's settings name: its file or directory, its tensorflow-datasets name, or the
    recipe's built-in data."""
    source = next((settings[name] for name in ("data", "dataset", "finetune") if settings.get(name)), None)
    return os.path.basename(os.path.normpath(str(source))) if source else "the built-in data"


def export(config: TrainingConfig, model, lora_rank, huggingface, tokenizer, labels, image_preprocessing) -> dict:
    """Writes the trained model for transformers or peft users where it can be; returns where, for
    metrics.json. A failure is logged, not raised: the trained run is recorded all the same. LoRA on a
    Hugging Face checkpoint gives both a peft adapter (the pairs alone) and the merged checkpoint.

    Written where transformers users can use it (`output_dir/huggingface`): a model fine-tuned from
    `huggingface` (with that checkpoint's tokenizer files), read by a `tokenizer` that writes itself for
    transformers (characters, byte-pair, WordPiece), a ViT given its `image_preprocessing`
    (`save_huggingface`'s), with a classifier's class names `labels`, or a model that carries its image processor."""
    written = {}
    if lora_rank and huggingface:
        from keras_tfm.convert import save_peft_adapter

        path = os.path.join(config.output_dir, "peft_adapter")
        try:
            save_peft_adapter(
                zoo_model(model), path, base=huggingface.directory, base_model_name_or_path=huggingface.base_model_name
            )
            log(f"LoRA pairs written as a peft adapter for {huggingface.base_model_name!r}: {path}")
            written["peft_adapter"] = path
        except (OSError, ValueError) as error:
            log(f"No peft adapter written: {error}")
    processor = getattr(zoo_model(model), "image_processor", None)
    if huggingface or (tokenizer is not None and tokenizer.writes_huggingface()) or image_preprocessing or processor:
        from keras_tfm.convert import save_huggingface

        path = os.path.join(config.output_dir, "huggingface")
        try:
            save_huggingface(
                zoo_model(model),
                path,
                tokenizer_from=huggingface.directory if huggingface else None,
                labels=labels,
                image_preprocessing=image_preprocessing,
                overwrite=True,  # the run's own directory: a run resumed after it finished writes it again
            )
            if (tokenizer is not None and tokenizer.writes_huggingface()) and not huggingface:
                tokenizer.save_huggingface(path)
        except (OSError, ValueError) as error:
            log(f"No Hugging Face checkpoint written: {error}")
            return written
        log(
            f"Trained model{' (LoRA pairs merged)' if lora_rank else ''} and its "
            f"{'image processor' if image_preprocessing or processor else 'tokenizer'} written as a Hugging Face checkpoint: {path}"
        )
        written["huggingface_checkpoint"] = path
    return written


def zoo_model(model: keras.Model) -> ZooModel | None:
    """`model`, or the keras_tfm model a recipe wrapped (the ViT recipe puts preprocessing before it)."""
    if isinstance(model, ZooModel):
        return model
    return next((layer for layer in sublayers(model) if isinstance(layer, ZooModel)), None)


def read_log(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    return {
        name: [float(row[name]) for row in rows if row.get(name) not in (None, "")]
        for name in (rows[0] if rows else {})
        if name != "epoch"
    }


def truncate_log(path: str, epochs_done: int) -> None:
    """Drops log rows of epochs after the checkpoint (written before a kill, about to be redone)."""
    if not os.path.exists(path):
        return
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.reader(file))
    if not rows:
        return
    kept = [rows[0]] + [row for row in rows[1:] if row and int(row[0]) < epochs_done]
    with open(path, "w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows(kept)
