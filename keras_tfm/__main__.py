"""`python -m keras_tfm COMMAND ...`: the commands of `keras_tfm.cli`.

python -m keras_tfm generate CHECKPOINT "Once upon a time"   continue a prompt, streamed
"""

from __future__ import annotations

import sys

COMMANDS = {"generate": "continue a prompt from a checkpoint, streaming the text as it is made"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        listing = "\n".join(f"  {name:10} {what}" for name, what in COMMANDS.items())
        print(f"usage: python -m keras_tfm COMMAND ...\n\ncommands:\n{listing}", file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from keras_tfm.cli import generate

    return generate.main(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
