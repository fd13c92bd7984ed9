"""Text samples while a language model trains: what a run's log shows of what the model writes."""

from __future__ import annotations

from collections.abc import Callable

import keras


class PrintSamples(keras.callbacks.Callback):
    """Prints `sample(model)` after every `every` epochs (0: never)."""

    def __init__(self, sample: Callable[[keras.Model], str], every: int):
        super().__init__()
        self.sample, self.every = sample, every

    def on_epoch_end(self, epoch, logs=None):
        if self.every and (epoch + 1) % self.every == 0:
            text = self.sample(self.model).lstrip("\n")  # a prompt of newlines (the default) is no blank line
            print(f"--- sample after epoch {epoch + 1} ---\n{text}\n---", flush=True)


def text_sampler(tokenizer, prompt: str, new_tokens: int, context: int, **generate_arguments) -> Callable:
    """`model -> text`: `new_tokens` tokens (at most what the context leaves) continuing `prompt`
    (a token 0 for an empty one), decoded with the prompt."""
    ids = list(tokenizer.encode(prompt)) or [0]
    new_tokens = max(1, min(new_tokens, context - len(ids)))

    def sample(model) -> str:
        return tokenizer.decode(model.generate([ids], max_new_tokens=new_tokens, **generate_arguments)[0])

    return sample
