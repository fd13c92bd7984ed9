"""Continue a prompt from the shell, or hold a conversation, streaming the text as it is made.

    python -m keras_tfm generate CHECKPOINT "Once upon a time" [--max-new-tokens 50] [--temperature 0.8]
    python -m keras_tfm generate CHECKPOINT --chat [--system "Be brief."]

With --chat, each line typed is a user's turn and the reply streams back; the conversation is kept
across turns and rendered with the checkpoint's chat template. Ctrl-C ends a reply, Ctrl-D leaves.

A prompt and its new tokens longer than the model's context (max_length) go on as nanoGPT does: each
token is chosen from the last tokens that fit (--no-crop-context refuses instead).

CHECKPOINT: a Hugging Face checkpoint directory or Hub model id (`keras_tfm.from_huggingface`, with its
tokenizer), or a `.keras` file saved with a tokenizer (a recipe's, or any model with `model.tokenizer` set).
"""

from __future__ import annotations

import argparse
import sys

from keras_tfm.cli.interrupt import pieces_until_ctrl_c
from keras_tfm.errors import InputError
from keras_tfm.generation.config import GenerationConfig
from keras_tfm.saving import load


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m keras_tfm generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="a Hugging Face directory or Hub id, or a .keras file")
    parser.add_argument("prompt", nargs="?", help="the text to continue (none with --chat)")
    parser.add_argument("--chat", action="store_true", help="a conversation: read turns from the terminal")
    parser.add_argument("--system", help="with --chat, a system message that opens the conversation")
    parser.add_argument(
        "--crop-context",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="past the model's context, keep the last tokens that fit (default: on)",
    )
    add_generation_flags(parser, max_new_tokens=50)
    parser.add_argument("--chunk-size", type=int, default=8, help="tokens per streamed piece (default: %(default)s)")
    return parser.parse_args(argv)


def add_generation_flags(parser: argparse.ArgumentParser, **defaults) -> None:
    """A flag for each `GenerationConfig` field a stream takes (`--top-p` for `top_p`), with its help;
    `defaults`: this command's own, where they differ from the config's."""
    for name, field in GenerationConfig.fields().items():
        if not field.metadata["flag"] or name in STREAM_REFUSES:
            continue
        default = defaults.get(name, field.default)
        kind = int if name == "seed" or isinstance(default, int) else float
        parser.add_argument(
            flag(name), type=kind, default=default, help=f"{field.metadata['help']} (default: %(default)s)"
        )


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


STREAM_REFUSES = ("num_beams", "length_penalty")  # beam search chooses its tokens only at the end


# the library's arguments as this command's flags and words
FLAGS = {name: flag(name) for name in (*GenerationConfig.fields(), "chunk_size", "crop_context")}
FLAGS["token_ids"] = "prompt"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if (args.prompt is None) != args.chat:
        print("error: give a prompt, or --chat (and no prompt)", file=sys.stderr)
        return 2
    try:
        model = load(args.checkpoint)
        if not hasattr(model, "stream"):
            raise InputError(f"{args.checkpoint!r} holds a {type(model).__name__}, not a language model.")
        if args.chat:
            from keras_tfm.cli.chat import conversation

            conversation(model, args.system, stream_arguments(args))
            return 0
        note_cropping(model, args)
        sys.stdout.write(args.prompt)
        for piece in pieces_until_ctrl_c(model.stream(args.prompt, **stream_arguments(args))):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
    except KeyboardInterrupt:  # Ctrl-C: what was written stays; one line, as the recipes end
        sys.stdout.flush()
        print("\ninterrupted (Ctrl-C).", file=sys.stderr)
        return 130
    except InputError as error:
        print(f"\nerror: {in_flags(error)}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as error:  # Keras' own, reading a file that is not a model
        print(f"\nerror: {args.checkpoint}: {error}", file=sys.stderr)
        return 2
    return 0


def note_cropping(model, args: argparse.Namespace) -> None:
    """Says so on standard error when the prompt and its new tokens pass the model's context."""
    tokenizer = model.tokenizer
    length = len(tokenizer.encode_prompt(args.prompt)) if tokenizer is not None else 0
    if args.crop_context and length + args.max_new_tokens > model.max_length:
        print(
            f"note: the prompt ({length} tokens) and {args.max_new_tokens} new tokens pass the model's context of "
            f"{model.max_length}: each token is chosen from the last tokens that fit (--no-crop-context refuses).",
            file=sys.stderr,
        )


def stream_arguments(args: argparse.Namespace) -> dict:
    """`model.stream`'s arguments from the flags: a `GenerationConfig`, the chunk size and the cropping."""
    settings = {name: getattr(args, name) for name in GenerationConfig.fields() if hasattr(args, name)}
    try:
        config = GenerationConfig(**settings)
    except InputError as error:
        raise InputError(error.message, error.argument, "generate") from None
    return {"config": config, "chunk_size": args.chunk_size, "crop_context": args.crop_context}


def in_flags(error: InputError) -> str:
    """The error in this command's words: the library's arguments as its flags."""
    message = error.words(FLAGS.get, quoted=False)
    where = FLAGS.get(error.argument, error.argument)
    return f"{where}: {message}" if where else message


if __name__ == "__main__":
    raise SystemExit(main())
