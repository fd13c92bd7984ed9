"""Train an encoder-decoder Transformer to translate, then report BLEU (sacreBLEU) with beam search.

Data (one of):
  --data PATH       a tab-separated file of pairs (e.g. spa.txt of the Anki English-Spanish pairs,
                    http://storage.googleapis.com/download.tensorflow.org/data/spa-eng.zip, English first;
                    --swap to translate the other way), or a directory of line-aligned files
                    {train,val,test}.{LANG}[.gz] (e.g. multi30k/task1/raw, from the data/ folder of
                    https://github.com/multi30k/dataset, with --source-language de --target-language en)
  --dataset NAME    tensorflow-datasets, e.g. ted_hrlr_translate/pt_to_en with --source-language pt
                    --target-language en (needs network once)
  (neither)         the offline default: generated English number words -> digits

Each side gets a keras-hub WordPiece vocabulary (or, with --tokenizer sentencepiece, a SentencePiece
unigram model, encoded by keras-hub) trained on the training split, saved in --output-dir and reused
on resume; the source side is lowercased, the target side keeps its case. Sentences are
cut to --sequence-length tokens; training batches group sentences of similar length and pad to a
multiple of 8. After training, the
test split is translated (--beam-size, default 4), detokenized (sacremoses) and scored with sacreBLEU
against the references, cased and lowercased; with --tokenized-references (e.g. Multi30k's
task1/tok/test_2016_flickr.lc.norm.tok.en) also on lowercased Moses-tokenized text, the score most
Multi30k papers report. Sample translations are printed and written to translations.txt.

    python recipes/translator.py --data multi30k/task1/raw --source-language de \\
        --target-language en --epochs 10 \\
        --tokenized-references multi30k/task1/tok/test_2016_flickr.lc.norm.tok.en
"""

from __future__ import annotations

import os

import numpy as np


def main() -> None:

    from keras_tfm import TokenCrossEntropy, training
    from keras_tfm.data import TranslationTokenizer, save_tokenizer

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    layers, args.num_layers = args.num_layers, None  # --num-layers sets both stacks
    depth = {} if layers is None else {"num_encoder_layers": layers, "num_decoder_layers": layers}
    config = training.training_config(args)
    training.setup(config)
    data, source_tokenizer, target_tokenizer, tokenized_references = parallel_data(args)
    pad, start, end = (target_tokenizer.token_id(t) for t in ("[PAD]", "[START]", "[END]"))
    assert source_tokenizer.token_id("[PAD]") == pad  # one padding id for both sides (0 for either kind)
    length = args.sequence_length
    train_x, train_y = encode_pairs(data.train, source_tokenizer, target_tokenizer, length)
    validation = encode_pairs(data.validation or data.test, source_tokenizer, target_tokenizer, length)

    def build_model():
        return training.build_model(
            sizes,
            args,
            source_vocabulary_size=source_tokenizer.vocabulary_size,
            target_vocabulary_size=target_tokenizer.vocabulary_size,
            share_embeddings=False,
            max_length=max(length + 1, args.max_length or 0),
            pad_token_id=pad,
            start_token_id=start,
            end_token_id=end,
            **depth,
        )

    build_model()  # refused now, before anything lasting is written
    for name, tokenizer in (("source", source_tokenizer), ("target", target_tokenizer)):
        save_tokenizer(tokenizer, args.output_dir, f"tokenizer_{name}")
    tokenizer = TranslationTokenizer(source_tokenizer, target_tokenizer, pad)  # translate() takes text
    result = training.train(
        config,
        build_model=build_model,
        train_batch=length_sorted_batches(train_x, train_y, pad, args),
        steps_per_pass=len(train_y) // args.batch_size,
        validation_data=validation,
        loss=TokenCrossEntropy(ignore_class=pad, label_smoothing=args.label_smoothing),  # the mean skips padding
        metrics=[token_accuracy(pad)],
        evaluate=bleu_evaluation(args, data, tokenizer, end, tokenized_references),
        tokenizer=tokenizer,
        # what is evaluated after training may change between runs of one model
        settings={
            **training.recipe_settings(args),
            "num_layers": layers,
        },
    )
    metrics = result.metrics
    tokenized = metrics.get("test_bleu_tokenized_lowercase")
    print(
        f"test BLEU on {metrics['test_sentences']} sentences: sacreBLEU {metrics['test_bleu']:.2f} "
        f"(lowercased {metrics['test_bleu_lowercase']:.2f})"
        + (f", tokenized lowercase {tokenized:.2f}" if tokenized is not None else "")
    )


def model_sizes() -> dict:
    from keras_tfm.models import translator

    return {name: getattr(translator, name) for name in ("transformer_small", "transformer_base", "transformer_big")}


def flags(sizes: dict):
    """The shared runtime's flags and this recipe's."""
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "transformer_small", "runs/translator")
    parser.set_defaults(batch_size=64, learning_rate=1e-3, weight_decay=0.01, epochs=10)
    recipe = parser.add_argument_group("translation")
    recipe.add_argument("--source-language", default="de", help="source file suffix / TFDS key (default: %(default)s)")
    recipe.add_argument("--target-language", default="en", help="target file suffix / TFDS key (default: %(default)s)")
    recipe.add_argument("--swap", action="store_true", help="a tab-separated file holds target<TAB>source")
    recipe.add_argument(
        "--tokenizer",
        choices=["wordpiece", "sentencepiece"],
        default="wordpiece",
        help="subword tokenizer of each language (default: %(default)s)",
    )
    recipe.add_argument(
        "--vocabulary-size",
        type=training.POSITIVE,
        default=8000,
        help="most subwords per language (default: %(default)s)",
    )
    recipe.add_argument(
        "--sequence-length", type=training.integer(3), default=48, help="tokens per sentence (default: %(default)s)"
    )
    recipe.add_argument(
        "--beam-size",
        type=training.POSITIVE,
        default=4,
        help="beam width for the test translations (default: %(default)s)",
    )
    recipe.add_argument(
        "--bleu-sentences", type=training.POSITIVE, default=None, help="translate only the first N test sentences"
    )
    recipe.add_argument(
        "--tokenized-references",
        metavar="FILE",
        help="lowercased, Moses-tokenized test references, one per line, for the comparable BLEU",
    )
    recipe.add_argument("--label-smoothing", type=training.FRACTION, default=0.1, help="(default: %(default)s)")
    parser.aliases["kind"] = "tokenizer"  # load_or_fit_tokenizer(kind=...)
    parser.unrecorded = ("beam_size", "bleu_sentences", "tokenized_references")
    return parser


def parallel_data(args) -> tuple:
    """(the sentence pairs, the source and target tokenizers fitted on their sides, the tokenized
    test references or None)."""
    from keras_tfm import training
    from keras_tfm.data import DataError, load_or_fit_tokenizer, load_parallel
    from keras_tfm.data.text import read_text

    languages = (args.source_language, args.target_language, args.swap)
    data = load_parallel(args.data, args.dataset, args.data_dir, *languages, log=training.log)
    if not data.train or not data.test:
        raise DataError("the training or test split is empty.", argument="data")
    source_tokenizer, target_tokenizer = (
        load_or_fit_tokenizer(
            args.tokenizer,
            "\n".join(p[side] for p in data.train),
            args.output_dir,
            args.vocabulary_size,
            log=training.log,
            name=f"tokenizer_{name}",
            save=False,
            lowercase=lowercase,
        )
        for side, name, lowercase in ((0, "source", True), (1, "target", False))
    )
    tokenized_references = None
    if args.tokenized_references:
        tokenized_references = read_text(args.tokenized_references, "tokenized_references").splitlines()
        if len(tokenized_references) != len(data.test):
            raise DataError(
                f"--tokenized-references: expected {len(data.test)} lines (one per test sentence), "
                f"{args.tokenized_references!r} has {len(tokenized_references)}."
            )
    return data, source_tokenizer, target_tokenizer, tokenized_references


def encode_pairs(pairs, source_tokenizer, target_tokenizer, length: int) -> tuple:
    """({"source_ids", "target_ids"}, next target ids), each `(pairs, length)` padded: the target
    side starts with [START] and its next ids end with [END]."""
    pad, start, end = (target_tokenizer.token_id(t) for t in ("[PAD]", "[START]", "[END]"))
    sources = source_tokenizer.encode_lines([p[0] for p in pairs])
    targets = target_tokenizer.encode_lines([p[1] for p in pairs])
    source_ids, target_in, target_out = (np.full((len(pairs), length), pad, "int32") for _ in range(3))
    for i, (s, t) in enumerate(zip(sources, targets)):
        s, t = s[:length], t[: length - 1]
        source_ids[i, : len(s)] = s
        target_in[i, : len(t) + 1] = np.concatenate([[start], t])
        target_out[i, : len(t) + 1] = np.concatenate([t, [end]])
    return {"source_ids": source_ids, "target_ids": target_in}, target_out


def length_sorted_batches(train_x: dict, train_y: np.ndarray, pad: int, args):
    """`train_batch(epoch, step)`: shuffled pairs, each run of 50 batches sorted by length, so that
    batches hold sentences of similar length and need little padding."""
    from keras_tfm.data import EpochBatches

    lengths = np.maximum((train_x["source_ids"] != pad).sum(1), (train_y != pad).sum(1))

    def by_length(shuffled: np.ndarray) -> np.ndarray:
        chunk = 50 * args.batch_size
        parts = np.split(shuffled, range(chunk, len(shuffled), chunk))
        return np.concatenate([part[np.argsort(lengths[part], kind="stable")] for part in parts])

    rows = EpochBatches(len(train_y), args.batch_size, args.seed, arrange=by_length)

    def train_batch(epoch: int, step: int):
        chosen = rows(epoch, step)
        # pad to the longest sentence, rounded up to a multiple of 8: a few shapes, a few XLA programs
        width = min(args.sequence_length, -(-int(lengths[chosen].max() + 1) // 8) * 8)
        return {k: v[chosen, :width] for k, v in train_x.items()}, train_y[chosen, :width]

    return train_batch


def token_accuracy(pad: int):
    """The metric of next-token accuracy over real target positions."""
    import keras

    def token_accuracy(y_true, y_pred):  # over real target positions, not padding
        mask = keras.ops.cast(keras.ops.not_equal(y_true, pad), "float32")
        hits = keras.ops.cast(
            keras.ops.equal(keras.ops.argmax(y_pred, axis=-1), keras.ops.cast(y_true, "int32")), "float32"
        )
        return keras.ops.sum(hits * mask) / keras.ops.maximum(keras.ops.sum(mask), 1.0)

    return token_accuracy


def bleu_evaluation(args, data, tokenizer, end: int, tokenized_references):
    """`evaluate(model)`: the test sentences translated (beam search) and scored with BLEU, written
    to translations.txt."""
    from keras_tfm import metrics as bleu

    length, pad = args.sequence_length, tokenizer.pad_token_id

    def decode(ids) -> str:
        ids = [int(i) for i in ids]
        ids = ids[: ids.index(end)] if end in ids else ids
        return tokenizer.target.decode([i for i in ids if i != pad]) if ids else ""

    def evaluate(model) -> dict:
        test = data.test[: args.bleu_sentences] if args.bleu_sentences else data.test
        sources = [s[:length] for s in tokenizer.source.encode_lines([p[0] for p in test])]
        # a source that encodes to no token (a line of control characters) has nothing to translate
        hypotheses = [""] * len(sources)
        rows = [i for i, source in enumerate(sources) if len(source)]
        for start_row in range(0, len(rows), 64):
            chosen = rows[start_row : start_row + 64]
            batch = [sources[i] for i in chosen]
            batch = batch + [batch[-1]] * (64 - len(batch))  # one shape, one compiled program
            translations = model.translate(batch, max_length=length, beam_size=args.beam_size)
            for i, row in zip(chosen, translations):
                hypotheses[i] = decode(row)
        hypotheses = bleu.detokenize(hypotheses, args.target_language)
        references = tokenized_references[: len(test)] if tokenized_references else None
        scores = bleu.bleu_scores(hypotheses, [p[1] for p in test], args.target_language, references)
        with open(os.path.join(args.output_dir, "translations.txt"), "w", encoding="utf-8") as file:
            for (source, reference), hypothesis in zip(test, hypotheses):
                file.write(f"{source}\t{reference}\t{hypothesis}\n")
        for (source, reference), hypothesis in list(zip(test, hypotheses))[:3]:
            print(f"  source:     {source}\n  reference:  {reference}\n  translated: {hypothesis}")
        return {**scores, "test_sentences": len(test), "beam_size": args.beam_size, "data": data.source}

    return evaluate


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
