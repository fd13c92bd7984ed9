"""The server's settings that both `create_app` and the command line take: each default and its help, once
(the command line's flags are made from these fields)."""

from __future__ import annotations

import dataclasses


def setting(default, help: str):
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """What `create_app` takes beside the model, where the command line offers it as a flag."""

    max_batch_size: int = setting(16, "rows decoded (or inputs embedded) together at most")
    max_queue: int = setting(64, "requests waiting at most; more get 429")
    default_max_tokens: int = setting(
        512, "the length of a request that names none, unless the checkpoint's generation config has `max_new_tokens`"
    )
    escape_special_tokens: bool = setting(
        True,
        "encode a chat message's text that spells a special token as plain text, so that a message cannot forge turns",
    )

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        return {field.name: field for field in dataclasses.fields(cls)}


DEFAULTS = ServerSettings()
