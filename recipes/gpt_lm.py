"""Train a GPT language model on text, then sample from it.

Data (one of):
  --data PATH         a UTF-8 text file (.txt or .txt.gz) or a directory of .txt files; the first 90%
                      trains, the last 10% validates (e.g. tiny Shakespeare's input.txt, from
                      https://github.com/karpathy/char-rnn, data/tinyshakespeare/input.txt)
  --dataset NAME      a tensorflow-datasets text dataset, e.g. tiny_shakespeare (needs network once)
  (neither)           the offline default: Python's bundled documentation text

Tokens are characters (`--tokenizer char`, nanoGPT's setting), or subwords: keras-hub's byte-pair
tokenizer (`--tokenizer bpe --vocabulary-size 8192`, GPT-2's byte-level BPE, merges learned on the
training text) or keras-hub WordPiece (`--tokenizer wordpiece`). Each epoch draws fresh random
windows of the model's context, as nanoGPT does. Reports validation loss and perplexity, prints samples as it trains, and
leaves checkpoints, log.csv, metrics.json, learning_curves.png and samples.txt in --output-dir.
Rerunning the same command resumes an interrupted run.

--model picks a GPT-2 size or a Llama-family one (`DecoderLM`: smollm2_135m, qwen2_5_0_5b, llama3_2_1b,
llama_shakespeare_char_cpu, ...), trained from scratch with the tokenizer above.

--from-huggingface DIR fine-tunes a Hugging Face checkpoint (a local directory saved by `save_pretrained`
with its tokenizer, or a Hub model id such as gpt2 or HuggingFaceTB/SmolLM2-135M, read from the local
Hugging Face cache or downloaded into it) on the text instead of training a new model: GPT-2 with its
byte-pair tokenizer (vocab.json, merges.txt), or Llama, Mistral, Qwen2 or Qwen3 with its tokenizer.json;
windows of --max-length tokens (default: the checkpoint's context, at most 1024). With --lora-rank only
LoRA pairs train. The run writes OUTPUT_DIR/huggingface, which transformers loads.

    python recipes/gpt_lm.py --data input.txt --steps 2000 --batch-size 12
    python recipes/gpt_lm.py --data input.txt --from-huggingface gpt2 \
        --max-length 256 --steps 200 --learning-rate 1e-4
    python recipes/gpt_lm.py --data input.txt \
        --from-huggingface HuggingFaceTB/SmolLM2-135M --lora-rank 8 --max-length 256 --steps 200
"""

from __future__ import annotations

import math
import os


def main() -> None:
    from keras_tfm import TokenCrossEntropy, convert, training

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    checkpoint, tokenizer = checkpoint_settings(args) if args.from_huggingface else (None, None)
    config = training.training_config(args, checkpoint)
    if args.prepare_only:
        prepare_shards(args, tokenizer, print)
        return
    training.setup(config)
    tokenizer, train, validation, source = text_data(args, checkpoint, tokenizer, sizes)
    sample = training.text_sampler(
        tokenizer,
        args.prompt,
        args.sample_tokens,
        train.context,
        temperature=args.temperature,
        top_k=args.top_k,
        seed=args.seed,
    )

    def evaluate(model) -> dict:
        loss = model.evaluate(*validation, batch_size=args.batch_size, verbose=0, return_dict=True)["loss"]
        kind, size = tokenizer.kind, tokenizer.vocabulary_size
        return {"validation_perplexity": math.exp(loss), "tokenizer": kind, "vocabulary_size": size, "data": source}

    def build_model():
        if checkpoint:
            return convert.from_huggingface(checkpoint.directory, adapter=checkpoint.adapter)
        return training.build_model(sizes, args, vocabulary_size=tokenizer.vocabulary_size, max_length=train.context)

    result = training.train(
        config,
        build_model=build_model,
        train_batch=train.batch,
        steps_per_pass=train.steps_per_pass,
        validation_data=validation,
        loss=TokenCrossEntropy(),
        callbacks=[training.PrintSamples(sample, args.sample_every if args.distribute == "none" else 0)],
        evaluate=evaluate,
        huggingface=checkpoint,
        tokenizer=tokenizer,
        settings=training.recipe_settings(args),
    )
    if training.processes().count > 1:  # sampling from a model spread over processes is not offered
        if training.is_writer():
            print(f"validation loss {result.metrics['validation_loss']:.4f}")
        return
    text_out = sample(result.model)
    with open(os.path.join(args.output_dir, "samples.txt"), "w", encoding="utf-8") as file:
        file.write(text_out)
    print(f"--- final sample ---\n{text_out}\n---")
    metrics = result.metrics
    print(f"validation loss {metrics['validation_loss']:.4f}, perplexity {metrics['validation_perplexity']:.2f}")


def model_sizes() -> dict:
    from keras_tfm.models import decoder_lm, gpt

    return {
        name: getattr(module, name)
        for module, names in (
            (gpt, ("gpt_shakespeare_char_cpu", "gpt_shakespeare_char", "gpt2_small", "gpt2_medium", "gpt2_large")),
            (gpt, ("gpt2_xl",)),
            (decoder_lm, ("llama_shakespeare_char_cpu", "llama_shakespeare_char", "smollm2_135m", "smollm2_360m")),
            (decoder_lm, ("qwen2_5_0_5b", "qwen3_0_6b", "llama3_2_1b", "llama3_8b", "mistral_7b")),
        )
        for name in names
    }


def flags(sizes: dict):
    """The shared runtime's flags and this recipe's."""
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "gpt_shakespeare_char_cpu", "runs/gpt_lm")
    parser.set_defaults(batch_size=12, learning_rate=3e-3, weight_decay=0.1, epochs=5)
    recipe = parser.add_argument_group("language model")
    recipe.add_argument(
        "--tokenizer", default="char", choices=["char", "bpe", "wordpiece"], help="(default: %(default)s)"
    )
    recipe.add_argument(
        "--vocabulary-size", type=training.POSITIVE, default=8192, help="subword vocabulary size (default: %(default)s)"
    )
    recipe.add_argument(
        "--eval-batches",
        type=training.POSITIVE,
        default=50,
        help="validation batches of random windows (default: %(default)s)",
    )
    recipe.add_argument("--prompt", default="\n", help="text the samples start from (default: a newline)")
    recipe.add_argument(
        "--sample-tokens", type=training.POSITIVE, default=200, help="tokens per sample (default: %(default)s)"
    )
    recipe.add_argument(
        "--sample-every", type=training.integer(0), default=1, help="print a sample every N epochs; 0 = only at the end"
    )
    recipe.add_argument(
        "--temperature", type=training.number(0.0), default=0.8, help="sampling temperature (default: %(default)s)"
    )
    recipe.add_argument(
        "--top-k",
        type=training.integer(0),
        default=20,
        help="sample among the k likeliest tokens (default: %(default)s)",
    )
    recipe.add_argument(
        "--from-huggingface",
        metavar="DIR",
        help="fine-tune this Hugging Face GPT-2 or Llama-family checkpoint directory or Hub model id, or a peft LoRA adapter on one (see above)",
    )
    recipe.add_argument(
        "--token-shards",
        metavar="DIR",
        help="train from token shards in DIR, read from disk batch by batch (for text larger than memory); prepared there from "
        "--data (one text file) when DIR has none, with the tokenizer fitted on the first 64 MiB of its text",
    )
    recipe.add_argument(
        "--prepare-only",
        action="store_true",
        help="prepare --token-shards and stop: run it once before starting several processes",
    )
    parser.aliases["kind"] = "tokenizer"  # load_or_fit_tokenizer(kind=...)
    parser.unrecorded = ("prompt", "sample_tokens", "sample_every", "temperature", "top_k", "prepare_only")
    return parser


def text_data(args, checkpoint, tokenizer, sizes: dict):
    """(tokenizer, training windows, validation batch, source): the text from --data, --dataset or
    --token-shards, tokenized (a new tokenizer fitted, or the checkpoint's), checked to hold a window."""
    from keras_tfm import training
    from keras_tfm.data import DataError, TokenWindows, load_or_fit_tokenizer, load_text, save_tokenizer

    if args.token_shards:
        tokenizer, train_ids, validation_ids, source = prepare_shards(args, tokenizer, training.log)
    else:
        text = load_text(args.data, args.dataset, args.data_dir, log=training.log)
        source = text.source
        if not checkpoint:
            tokenizer = load_or_fit_tokenizer(
                args.tokenizer, text.train, args.output_dir, args.vocabulary_size, log=training.log, save=False
            )
        train_ids, validation_ids = tokenizer.encode(text.train), tokenizer.encode(text.validation)
    if checkpoint:
        context = args.max_length or checkpoint_positions(checkpoint.config, cap=1024)
    else:  # constructing a size is cheap (weights are made at build time); it tells the default context
        context = (
            args.max_length or training.build_model(sizes, args, vocabulary_size=tokenizer.vocabulary_size).max_length
        )
    for name, ids in (("training", train_ids), ("validation", validation_ids)):
        if len(ids) <= context + 1:
            raise DataError(
                f"the {name} text has {len(ids)} tokens, fewer than one window of "
                f"{context + 1}; give more text or a smaller `max_length`.",
                argument="data",
            )
    if not checkpoint and training.is_writer():  # only now, with the data and the model accepted
        save_tokenizer(tokenizer, args.output_dir)
    train = TokenWindows(train_ids, context, args.batch_size, args.seed)
    validation = TokenWindows(validation_ids, context, args.batch_size, args.seed).fixed(args.eval_batches)
    return tokenizer, train, validation, source


def checkpoint_settings(args):
    """The --from-huggingface checkpoint and its tokenizer, after refusing the flags it fixes."""
    from keras_tfm import training
    from keras_tfm.data import BytePairTokenizer, DataError, HuggingFaceTokenizer

    checkpoint = training.checkpoint_config(
        args,
        ("gpt2", "llama", "mistral", "qwen2", "qwen3"),
        {"model": "gpt_shakespeare_char_cpu", "tokenizer": "char", "vocabulary_size": 8192},
        "takes the model and its tokenizer from the checkpoint",
        keep=("max_length",),
    )
    positions, embeddings = checkpoint_positions(checkpoint.config), checkpoint.config["vocab_size"]
    if args.max_length and args.max_length > positions:
        raise DataError(f"the checkpoint has {positions} positions; got {args.max_length}.", argument="max_length")
    if checkpoint.config["model_type"] == "gpt2":
        tokenizer = BytePairTokenizer.from_huggingface(checkpoint.directory)
    else:
        tokenizer = HuggingFaceTokenizer.from_huggingface(checkpoint.directory)
    if tokenizer.vocabulary_size > embeddings:
        raise DataError(
            f"the tokenizer has {tokenizer.vocabulary_size} tokens, more than the checkpoint's {embeddings} embeddings.",
            argument="from_huggingface",
        )
    return checkpoint, tokenizer


def prepare_shards(args, tokenizer, log):
    """(tokenizer, training ids, validation ids, source) from `--token-shards`, prepared from `--data` if
    the directory has none yet; `tokenizer` (a checkpoint's, or an earlier run's in `--output-dir`) must
    be the shards' own."""
    from keras_tfm import training
    from keras_tfm.data import DataError, load_or_fit_tokenizer, load_tokenizer, shards

    earlier = os.path.join(args.output_dir, "tokenizer.json")
    if tokenizer is None and os.path.exists(earlier):
        tokenizer = load_tokenizer(earlier)
    if not os.path.exists(os.path.join(args.token_shards, "meta.json")):
        if not args.data or args.dataset:
            raise DataError("to prepare them, give `data`, one text file (not `dataset`).", "token_shards")
        if training.processes().count > 1:
            raise DataError(
                "prepare them before starting several processes: run the command once with --prepare-only.",
                "token_shards",
            )
        if tokenizer is None:
            sample = shards.text_sample(args.data)
            tokenizer = load_or_fit_tokenizer(
                args.tokenizer, sample, args.output_dir, args.vocabulary_size, log=log, save=False
            )
        shards.prepare_token_shards(args.data, tokenizer, args.token_shards, log=log)
    meta = shards.read_meta(args.token_shards, shards.tokenizer_digest(tokenizer) if tokenizer else None)
    if args.data:  # shards of another text, or of this file before it changed, would train on the old text
        shards.check_source(meta, args.token_shards, shards.source_record(args.data))
    if tokenizer is None and meta["tokenizer"].get("kind") != args.tokenizer:
        raise DataError(
            f"the shards in {args.token_shards!r} were made by a {meta['tokenizer'].get('kind')} tokenizer, not "
            f"{args.tokenizer}; give `tokenizer` {meta['tokenizer'].get('kind')}, or a new directory to prepare.",
            "token_shards",
        )
    tokenizer = tokenizer or shards.shards_tokenizer(meta)
    log(f"Data: token shards in {args.token_shards} (from {meta['source']}), read from disk as batches need them.")
    train, validation = (shards.TokenShards(args.token_shards, split) for split in shards.SPLITS)
    return tokenizer, train, validation, f"token shards of {meta['source']}"


def checkpoint_positions(config: dict, cap: int | None = None) -> int:
    """The context of a checkpoint's config (GPT-2's `n_positions`, the others' `max_position_embeddings`),
    at most `cap`: Llama-family contexts (8192 to 131072 tokens) are longer than a window to train on here."""
    positions = config["n_positions"] if config["model_type"] == "gpt2" else config["max_position_embeddings"]
    return positions if cap is None else min(positions, cap)


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
