"""Pretrain BERT as a masked language model on text, then (with --finetune) fine-tune it to classify.

Data (one of):
  --data PATH       UTF-8 text: a file (.txt, .gz), a directory of .txt files, a .zip of .txt files, or several
                    of these separated by commas (e.g. wikitext-2/valid.txt,movie_reviews.zip: WikiText-2 from
                    https://github.com/pytorch/examples, word_language_model/data/wikitext-2; the movie
                    reviews from https://github.com/nltk/nltk_data, packages/corpora/movie_reviews.zip)
  --dataset NAME    a tensorflow-datasets text dataset, e.g. imdb_reviews (needs network once)
  (neither)         the offline default: Python's bundled documentation text
--validation-data PATH holds out other text (e.g. wikitext-2/test.txt); otherwise the last
10% of the text validates.

A keras-hub WordPiece vocabulary is trained on the text (compute_word_piece_vocabulary) unless an earlier
run saved one in --output-dir. The token stream is cut into sequences of --sequence-length ([CLS] ... [SEP]).
Masking is dynamic, as in the original recipe: each batch of each epoch draws new masks (15% of tokens,
never [CLS]/[SEP]/[PAD]; of those 80% [MASK], 10% random, 10% unchanged), seeded by (seed, epoch, step) so
a resumed run sees the same masks (keras_tfm.data.masking; keras-hub's MaskedLMMaskGenerator cannot be
seeded per batch). Reports held-out
masked-token accuracy and perplexity.

--finetune PATH then trains a BertClassifier that starts from the pretrained encoder on texts labelled
by folder (a zip or a directory of <label>/<file>.txt, e.g. movie_reviews.zip),
holding out 10%, and reports its accuracy (in --output-dir/finetune).

--from-huggingface DIR skips pretraining and fine-tunes a Hugging Face BERT checkpoint instead (a local
directory saved by `save_pretrained` with its tokenizer, or a Hub model id such as bert-base-uncased, read
from the local Hugging Face cache or downloaded into it): its WordPiece vocabulary
(vocab.txt, lowercased as its tokenizer_config.json says), its weights and pooler, a new head.

    python recipes/bert_mlm.py --data wikitext-2/valid.txt --validation-data wikitext-2/test.txt \\
        --finetune movie_reviews.zip
    python recipes/bert_mlm.py --from-huggingface bert-base-uncased --finetune movie_reviews.zip
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np


def main() -> None:
    import keras

    from keras_tfm import TokenCrossEntropy, training
    from keras_tfm.data import load_labelled_text, save_tokenizer

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    if args.from_huggingface:
        finetune_checkpoint(args)
        return
    check_flags(args)
    config = training.training_config(args)
    training.setup(config)
    # read now, so that a bad --finetune is refused before pretraining, not after it
    labelled = load_labelled_text(args.finetune, "finetune") if args.finetune else None
    tokenizer, special, train_batch, steps_per_pass, validation, source = masked_text(args)

    def evaluate(model) -> dict:
        x, y, weights = validation
        loss = model.evaluate(x, y, sample_weight=weights, batch_size=args.batch_size, verbose=0, return_dict=True)
        return {
            "validation_perplexity": math.exp(loss["loss"]),
            "vocabulary_size": tokenizer.vocabulary_size,
            "masked_tokens_evaluated": int(weights.sum()),
            "data": source,
        }

    encoder_config = dict(vocabulary_size=tokenizer.vocabulary_size, max_length=args.max_length or args.sequence_length)
    training.build_model(sizes, args, **encoder_config)  # refused now, before anything lasting is written
    save_tokenizer(tokenizer, args.output_dir)
    result = training.train(
        dataclasses.replace(config, lora_rank=None, lora_alpha=None),  # --lora-rank is for the --finetune stage
        build_model=lambda: training.build_model(sizes, args, **encoder_config),
        train_batch=train_batch,
        steps_per_pass=steps_per_pass,
        validation_data=validation,
        loss=TokenCrossEntropy(reduction="mean_with_sample_weight"),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="masked_accuracy")],
        evaluate=evaluate,
        tokenizer=tokenizer,
        # the fine-tuning stage's flags do not change pretraining, which a first run may do alone
        settings=training.recipe_settings(args, ignore=FINETUNING_FLAGS),
    )
    print(
        f"held-out masked-token accuracy {result.metrics['validation_masked_accuracy']:.4f}, "
        f"perplexity {result.metrics['validation_perplexity']:.2f}"
    )
    if args.finetune:

        def pretrained_classifier(num_classes: int):
            classifier = training.build_model(sizes, args, head="classifier", num_classes=num_classes, **encoder_config)
            classifier.build()
            classifier.encoder.set_weights(result.model.encoder.get_weights())
            return classifier

        finetune(args, config, tokenizer, special, pretrained_classifier, labelled)


def model_sizes() -> dict:
    from keras_tfm.models import bert_sizes

    names = ("bert_tiny", "bert_mini", "bert_small", "bert_medium", "bert_base", "bert_large")
    return {name: getattr(bert_sizes, name) for name in names}


def flags(sizes: dict):
    """The shared runtime's flags and this recipe's."""
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "bert_mini", "runs/bert_mlm")
    parser.set_defaults(batch_size=16, learning_rate=5e-4, weight_decay=0.01, epochs=5)
    recipe = parser.add_argument_group("masked language model")
    recipe.add_argument("--validation-data", metavar="PATH", help="held-out text (default: the last 10%% of --data)")
    recipe.add_argument(
        "--vocabulary-size",
        type=training.POSITIVE,
        default=8192,
        help="WordPiece vocabulary size (default: %(default)s)",
    )
    recipe.add_argument(
        "--sequence-length", type=training.integer(3), default=128, help="tokens per sequence (default: %(default)s)"
    )
    recipe.add_argument(
        "--mask-rate",
        type=training.number(0.0, 1.0, above_minimum=True),
        default=0.15,
        help="share of tokens selected (default: %(default)s)",
    )
    recipe.add_argument(
        "--mask-positions",
        type=training.POSITIVE,
        default=20,
        help="most masked positions per sequence (default: %(default)s)",
    )
    recipe.add_argument(
        "--finetune", metavar="PATH", help="labelled texts to fine-tune a classifier on after pretraining"
    )
    recipe.add_argument("--finetune-epochs", type=training.POSITIVE, default=3, help="(default: %(default)s)")
    recipe.add_argument(
        "--finetune-learning-rate", type=training.number(0.0), default=1e-4, help="(default: %(default)s)"
    )
    recipe.add_argument(
        "--from-huggingface",
        metavar="DIR",
        help="skip pretraining: fine-tune this Hugging Face BERT checkpoint directory or Hub model id, or a peft LoRA adapter on one (see above)",
    )
    return parser


def check_flags(args) -> None:
    """Refuses flags that cannot go together, before anything is read."""
    from keras_tfm import training

    if args.lora_rank and not args.finetune:
        raise training.InputError(
            "LoRA fine-tunes pretrained weights: give --finetune PATH (the classifier stage after "
            "pretraining) or --from-huggingface DIR; pretraining trains every weight.",
            argument="lora_rank",
        )
    if args.max_length is not None and args.max_length < args.sequence_length:
        raise training.InputError(
            f"the model's positions must hold a sequence of `sequence_length` {args.sequence_length}; "
            f"got {args.max_length}.",
            argument="max_length",
        )


def masked_text(args) -> tuple:
    """(the WordPiece tokenizer, its (pad, cls, sep) ids, `train_batch`, steps per pass, the masked
    validation batch, the data's source): the text packed into sequences of `sequence_length`,
    masked anew for every batch."""
    from keras_tfm import training
    from keras_tfm.data import EpochBatches, load_or_fit_tokenizer, load_text, read_text
    from keras_tfm.data.masking import DynamicMasker, pack_sequences
    from keras_tfm.data.tokenizers import WORDPIECE_RESERVED

    text = load_text(args.data, args.dataset, args.data_dir, log=training.log)
    validation_text = read_text(args.validation_data, "validation_data") if args.validation_data else text.validation
    tokenizer = load_or_fit_tokenizer(
        "wordpiece", text.train, args.output_dir, args.vocabulary_size, log=training.log, save=False
    )
    pad, cls, sep, mask = (WORDPIECE_RESERVED.index(t) for t in ("[PAD]", "[CLS]", "[SEP]", "[MASK]"))
    length = args.sequence_length
    train_sequences = pack_sequences(tokenizer.encode(text.train), length, cls, sep)
    validation_sequences = pack_sequences(tokenizer.encode(validation_text), length, cls, sep, "validation")
    training.log(
        f"Sequences: {len(train_sequences):,} for training, {len(validation_sequences):,} held out, "
        f"{length} tokens each."
    )
    masked = DynamicMasker(tokenizer.vocabulary_size, mask, [pad, cls, sep], pad, args.mask_rate, args.mask_positions)
    rows = EpochBatches(len(train_sequences), args.batch_size, args.seed)

    def train_batch(epoch: int, step: int):
        return masked(train_sequences[rows(epoch, step)], [args.seed, epoch, step])

    validation = masked(validation_sequences, [args.seed, 1 << 20])
    steps_per_pass = len(train_sequences) // args.batch_size
    return tokenizer, (pad, cls, sep), train_batch, steps_per_pass, validation, text.source


FINETUNING_FLAGS = ("finetune", "finetune_epochs", "finetune_learning_rate", "lora_rank", "lora_alpha")


def finetune_checkpoint(args) -> None:
    """--from-huggingface: fine-tunes the checkpoint, with its own tokenizer, on --finetune."""
    from keras_tfm import convert, training
    from keras_tfm.data import DataError, WordPieceTokenizer

    if not args.finetune:
        raise DataError(
            "give --finetune PATH, the labelled texts to fine-tune the checkpoint on.", argument="from_huggingface"
        )
    checkpoint = training.checkpoint_config(
        args,
        "bert",
        {"model": "bert_mini", "data": None, "dataset": None, "validation_data": None},
        "fine-tunes the checkpoint without pretraining",
    )
    positions = checkpoint.config["max_position_embeddings"]
    if args.sequence_length > positions:
        raise DataError(
            f"the checkpoint has {positions} positions; got {args.sequence_length}.", argument="sequence_length"
        )
    config = training.training_config(args, checkpoint)
    training.setup(config)
    tokenizer = WordPieceTokenizer.from_huggingface(checkpoint.directory)
    special = tuple(tokenizer.token_id(token) for token in ("[PAD]", "[CLS]", "[SEP]"))
    finetune(
        args,
        config,
        tokenizer,
        special,
        lambda num_classes: convert.from_huggingface(checkpoint.directory, num_classes, adapter=checkpoint.adapter),
        huggingface=checkpoint,
    )


def finetune(args, config, tokenizer, special, make_classifier, labelled=None, huggingface=None) -> None:
    """Trains the BertClassifier `make_classifier(num_classes)` on `[CLS] text [SEP]` rows of `labelled`
    (`load_labelled_text(args.finetune)` when not given), in `output_dir/finetune`; `huggingface`: the
    checkpoint `make_classifier` loads, if any."""
    import keras

    from keras_tfm import training
    from keras_tfm.data import EpochBatches, load_labelled_text
    from keras_tfm.data.masking import pack_rows

    pad, cls, sep = special
    texts, labels, class_names = labelled or load_labelled_text(args.finetune, "finetune")
    # WordPiece gives every word (bar one of control characters only) at least one token, so the first
    # --sequence-length words give every token the packing keeps; tokenizing whole reviews is slow.
    heads = [" ".join(text.split()[: args.sequence_length]) for text in texts]
    ids = pack_rows(tokenizer.encode_lines(heads), args.sequence_length, cls, sep, pad)
    order = np.random.default_rng(args.seed).permutation(len(texts))
    cut = int(0.9 * len(texts))
    train_rows, test_rows = order[:cut], order[cut:]
    training.log(
        f"Fine-tuning data: {args.finetune!r}: {len(train_rows)} training and {len(test_rows)} "
        f"test texts, classes {class_names}."
    )

    def inputs(rows):
        return {"token_ids": ids[rows], "padding_mask": ids[rows] != pad}

    stage = dataclasses.replace(
        config,
        output_dir=os.path.join(config.output_dir, "finetune"),
        epochs=args.finetune_epochs,
        steps=None,
        steps_per_epoch=None,
        learning_rate=args.finetune_learning_rate,
    )
    os.makedirs(stage.output_dir, exist_ok=True)

    batch_rows = EpochBatches(len(train_rows), args.batch_size, [args.seed, 7], arrange=lambda order: train_rows[order])

    def train_batch(epoch: int, step: int):
        rows = batch_rows(epoch, step)
        return inputs(rows), labels[rows]

    result = training.train(
        stage,
        build_model=lambda: make_classifier(len(class_names)),
        train_batch=train_batch,
        steps_per_pass=len(train_rows) // args.batch_size,
        validation_data=(inputs(test_rows), labels[test_rows]),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        pretrained=True,
        huggingface=huggingface,
        tokenizer=tokenizer,
        labels=class_names,
        settings=training.recipe_settings(args),
    )
    print(
        f"fine-tuned classification accuracy {result.metrics['validation_accuracy']:.4f} on {len(test_rows)} held-out texts"
    )


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
