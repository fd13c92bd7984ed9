"""Train a small CLIP from scratch on images and their captions, then classify held-out images zero-shot.

Data: --data PATH, as recipes/vit.py reads it (an IDX directory such as ../shared/data/fashion-mnist, an .npz
file or an image folder PATH/<class>/...); the offline default is scikit-learn's bundled 8x8 digits. Each training
image gets a caption from its class's name, "a photo of a sneaker." (Fashion-MNIST's and the digits' names are
known; an image folder's are its folders' names), in one of a few phrasings drawn per image. A word-level
tokenizer is made from the captions' words (start and end tokens added, as CLIP's).

The model is a CLIP of two small towers (a ViT for the images, a causal text encoder for the captions) trained
with CLIP's contrastive loss on pairs alone; its temperature is learned and clamped as open_clip's. At the end
it classifies held-out test images zero-shot, from prompts of the class names in other phrasings than the
training captions, ensembled as open_clip does, and retrieves images by text (for each class's prompt, the share
of its nearest k test images of that class: precision@1/5/10). Leaves checkpoints, log.csv, metrics.json and
learning_curves.png in --output-dir; rerunning resumes.

--from-huggingface DIR fine-tunes a CLIP checkpoint instead (a local directory saved by `save_pretrained` with its
tokenizer and image processor, or a Hub model id such as openai/clip-vit-base-patch32, read from the local Hugging
Face cache or downloaded into it): its tokenizer reads the captions, its image processor prepares the images (as
they are drawn, a batch at a time), and the trained model is written back as a checkpoint.

    python recipes/clip.py --data ../shared/data/fashion-mnist --epochs 5
    python recipes/clip.py --data ../shared/data/fashion-mnist --from-huggingface openai/clip-vit-base-patch32 \
        --epochs 1 --learning-rate 1e-5
"""

from __future__ import annotations

import numpy as np

FASHION = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot"]
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
CAPTIONS = ["a photo of a {}.", "a picture of a {}.", "an image of the {}.", "the {}, photographed."]
PROMPTS = ["a photo of a {}.", "a {} in a photo.", "this is a {}."]  # zero-shot prompts, phrased apart


def main() -> None:
    from keras_tfm import ContrastiveLoss, training
    from keras_tfm.data import EpochBatches, load_images

    sizes = model_sizes()
    args = flags(sizes).parse_args()
    checkpoint = checkpoint_settings(args) if args.from_huggingface else None
    config = training.training_config(args, checkpoint)
    training.setup(config)
    data = load_images(args.data, args.dataset, args.data_dir, log=training.log)
    names = class_names(data)
    (train_x, train_y), (test_x, test_y) = data.train, data.test
    captions = [CAPTIONS[i] for i in np.random.default_rng(args.seed).integers(0, len(CAPTIONS), len(train_y))]
    tokenizer, prepare, length = inputs_of(checkpoint, names)
    train_ids = tokenize(tokenizer, [c.format(names[y]) for c, y in zip(captions, train_y)], length)
    test_ids = tokenize(tokenizer, [CAPTIONS[0].format(names[y]) for y in test_y[: args.validation_examples]], length)
    rows = EpochBatches(len(train_x), args.batch_size, args.seed)

    def train_batch(epoch: int, step: int):
        chosen = rows(epoch, step)
        return {"images": prepare(train_x[chosen]), "token_ids": train_ids[chosen]}, np.zeros(len(chosen), "float32")

    def build_model():
        if checkpoint:
            from keras_tfm import convert

            return convert.from_huggingface(checkpoint.directory)
        return sizes[args.model](args, train_x.shape[1], tokenizer)

    held_out = test_x[: args.validation_examples]
    result = training.train(
        config,
        build_model=build_model,
        train_batch=train_batch,
        steps_per_pass=len(train_x) // args.batch_size,
        validation_data=({"images": prepare(held_out), "token_ids": test_ids}, np.zeros(len(held_out), "float32")),
        loss={"logits_per_image": ContrastiveLoss()},
        evaluate=lambda model: zero_shot(model, test_x[: args.test_examples], test_y[: args.test_examples], names),
        huggingface=checkpoint,
        tokenizer=tokenizer,
        settings=training.recipe_settings(args),
    )
    metrics = result.metrics
    print(f"zero-shot accuracy {metrics['zero_shot_accuracy']:.4f} on {min(args.test_examples, len(test_y)):,} "
          f"held-out images (chance {1 / len(names):.2f}); retrieval precision@1/5/10 "
          f"{metrics['retrieval_precision_at_1']:.3f} / {metrics['retrieval_precision_at_5']:.3f} / "
          f"{metrics['retrieval_precision_at_10']:.3f}")  # fmt: skip


def model_sizes() -> dict:
    """The recipe's CLIP sizes: each `(args, image side, tokenizer) -> CLIP`."""
    return {"clip_small_images": small_clip}


def flags(sizes: dict):
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "clip_small_images", "runs/clip")
    parser.set_defaults(batch_size=64, learning_rate=1e-3, weight_decay=0.05, epochs=5)
    recipe = parser.add_argument_group("image-text model")
    recipe.add_argument("--from-huggingface", metavar="DIR",
                        help="fine-tune this CLIP checkpoint directory or Hub model id (its tokenizer and image "
                        "processor prepare the captions and images)")  # fmt: skip
    recipe.add_argument("--embedding-dim", type=training.POSITIVE, default=64, help="the shared space (default: 64)")
    recipe.add_argument("--validation-examples", type=training.POSITIVE, default=512,
                        help="test images (with captions) the loss is validated on (default: %(default)s)")  # fmt: skip
    recipe.add_argument("--test-examples", type=training.POSITIVE, default=2000,
                        help="test images classified zero-shot at the end (default: %(default)s)")  # fmt: skip
    return parser


def checkpoint_settings(args):
    """The --from-huggingface checkpoint: a CLIP, whose size the flags may not change."""
    from keras_tfm import training

    return training.checkpoint_config(args, "clip", {"model": "clip_small_images", "embedding_dim": 64},
                                      "takes the model from the checkpoint")  # fmt: skip


def inputs_of(checkpoint, names: list[str]) -> tuple:
    """(tokenizer, images -> the model's pixels, the captions' length): the checkpoint's tokenizer, processor and
    text length, or a word-level tokenizer of the captions, pixels in [0, 1] and 12 tokens."""
    if checkpoint is None:
        return caption_tokenizer(names), pixels, 12
    from keras_tfm.data import DataError, ImageProcessor, checkpoint_tokenizer

    tokenizer, processor = (
        checkpoint_tokenizer(checkpoint.directory),
        ImageProcessor.from_huggingface(checkpoint.directory),
    )
    if tokenizer is None or processor is None:
        raise DataError(
            "the checkpoint needs its tokenizer.json and preprocessor_config.json.", argument="from_huggingface"
        )
    length = (checkpoint.config.get("text_config") or {}).get("max_position_embeddings", 77)
    return (
        tokenizer,
        lambda images: processor([image[..., 0] if image.shape[-1] == 1 else image for image in images]),
        length,
    )


def class_names(data) -> list[str]:
    """The classes' names the captions use: Fashion-MNIST's, the digits', or the folders'."""
    if len(data.class_names) == 10 and "fashion" in data.source.lower():
        return FASHION
    if len(data.class_names) == 10 and all(name.isdigit() for name in data.class_names):
        return DIGITS
    return [name.replace("_", " ").lower() for name in data.class_names]


def caption_tokenizer(names: list[str]):
    """A word-level tokenizer of the captions' and prompts' words, with CLIP's start and end tokens."""
    import tokenizers

    from keras_tfm.data import HuggingFaceTokenizer

    words = {w for text in CAPTIONS + PROMPTS for name in names for w in text.format(name).lower().split()}
    vocabulary = {word: i for i, word in enumerate(["<pad>", "<unk>", "<start>", "<end>", *sorted(words)])}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="<unk>"))
    tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="<start> $A <end>", special_tokens=[("<start>", 2), ("<end>", 3)]
    )
    return HuggingFaceTokenizer(tokenizer.to_str())


def tokenize(tokenizer, texts: list[str], length: int) -> np.ndarray:
    """The texts' ids, cut at `length` (the end token kept) and padded with 0."""
    ids = tokenizer.encode_batch(texts, max_length=length)
    padded = np.zeros((len(ids), length), "int32")
    for row, values in enumerate(ids):
        padded[row, : len(values)] = values
    return padded


def pixels(images: np.ndarray) -> np.ndarray:
    """RGB floats in [0, 1], as the model's image processor makes them."""
    x = images.astype("float32") / 255.0
    return np.repeat(x, 3, axis=-1) if x.shape[-1] == 1 else x


def small_clip(args, side: int, tokenizer):
    """Two towers of 2 layers, 4 heads, 64 wide (or --num-layers, --num-heads, --hidden-dim, --intermediate-dim,
    both towers alike) for small images (patches of 4 pixels, or 2) and captions of up to 12 tokens."""
    import keras_tfm
    from keras_tfm.data import DataError, ImageProcessor

    for name in ("dropout", "max_length"):
        if getattr(args, name, None) is not None:
            raise DataError("the recipe's CLIP has no such setting (its captions hold 12 tokens).", argument=name)
    towers = dict(num_layers=2, num_heads=4, hidden_dim=64)
    towers.update({name: getattr(args, name) for name in ("num_layers", "num_heads", "hidden_dim", "intermediate_dim")
                   if getattr(args, name, None) is not None})  # fmt: skip
    patch = 4 if side % 4 == 0 else 2
    vision = keras_tfm.ViT(image_size=side, patch_size=patch, include_top=False, patch_bias=False,
                           norm_before_blocks=True, name="vision_encoder", **towers)  # fmt: skip
    text = keras_tfm.CLIPTextEncoder(vocabulary_size=tokenizer.vocabulary_size, max_length=12, end_token_id=3,
                                     name="text_encoder", **towers)  # fmt: skip
    model = keras_tfm.CLIP(vision, text, projection_dim=args.embedding_dim)
    model.image_processor = ImageProcessor(size={"height": side, "width": side}, do_normalize=False)
    model.tokenizer = tokenizer
    return model


def zero_shot(model, images: np.ndarray, labels: np.ndarray, names: list[str]) -> dict:
    """Zero-shot accuracy of the held-out images (prompts ensembled) and text-to-image retrieval precision@k."""
    model.tokenizer = model.tokenizer or caption_tokenizer(names)
    images = [image[..., 0] if image.shape[-1] == 1 else image for image in images]
    answers = model.zero_shot_classify(images, names, templates=PROMPTS, top_k=1)
    accuracy = float(np.mean([names.index(answer[0]["label"]) == y for answer, y in zip(answers, labels)]))
    similarity = model.similarity(images, [PROMPTS[0].format(name) for name in names])  # (images, classes)
    nearest = np.argsort(-similarity, axis=0)  # each class's images, nearest first
    precision = {f"retrieval_precision_at_{k}": float(np.mean(labels[nearest[:k]] == np.arange(len(names))))
                 for k in (1, 5, 10)}  # fmt: skip
    return {"zero_shot_accuracy": accuracy, **precision}


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
