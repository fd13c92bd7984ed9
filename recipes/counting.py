"""Answer a question about a picture: "how many circles?". The question's tokens attend to the picture's patch
tokens (cross-attention), the seeds' picture of a text query over image tokens, and the answer is read from the
question's last token.

Data: generated pictures of 0 to --max-shapes circles, squares and triangles on textured backgrounds
(`keras_tfm.data.make_shapes`), each asked about one kind drawn at random ("how many squares ?"), the answer the
count (0 to --max-shapes). --train-images and --test-images from --seed.

The model, built from the library's layers: the picture's 8 x 8 patches (`PatchEmbedding`, 2-D sinusoidal positions)
through --image-layers `EncoderBlock`s; the question's words (`TokenEmbedding`, learned positions) through
--num-layers `DecoderBlock`s that attend to each other and to the patches; a linear layer on the last word
scores the answers. It is compared with the best a model that sees only the question can do: the most frequent
training answer to each question. Leaves checkpoints, log.csv, metrics.json, learning_curves.png and
attention_maps.png (where the question's last word looked, per head) in --output-dir; rerunning resumes.

    python recipes/counting.py --epochs 20
"""

from __future__ import annotations

import numpy as np

WORDS = ["how", "many", "circles", "squares", "triangles", "?"]


def main() -> None:
    import keras

    from keras_tfm import training
    from keras_tfm.data import EpochBatches, shape_splits

    args = flags(model_sizes()).parse_args()
    config = training.training_config(args)
    training.setup(config)
    shapes = shape_splits(args, min_shapes=0, log=training.log)
    train, test = (questions(split, args.seed + i) for i, split in enumerate(shapes))
    rows = EpochBatches(args.train_images, args.batch_size, args.seed)
    result = training.train(
        config,
        build_model=lambda: build_model(args),
        train_batch=lambda epoch, step: batch(train, rows(epoch, step)),
        steps_per_pass=args.train_images // args.batch_size,
        validation_data=batch(test, slice(None)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        evaluate=lambda model: {
            "question_only_accuracy": question_only_accuracy(train, test),
            "attention_maps": draw_attention(model, test, args),
        },  # fmt: skip
        settings=training.recipe_settings(args),
    )
    metrics = result.metrics
    print(f"accuracy on {args.test_images:,} test questions: {metrics['validation_accuracy']:.4f}; "
          f"seeing only the question: {metrics['question_only_accuracy']:.4f}")  # fmt: skip


def model_sizes() -> dict:
    return {"counter": build_model}


def flags(sizes: dict):
    from keras_tfm import training

    parser = training.recipe_parser(__doc__, sizes, "counter", "runs/counting")
    parser.set_defaults(batch_size=64, learning_rate=1e-3, weight_decay=1e-2, epochs=20)
    recipe = parser.add_argument_group("counting")
    recipe.add_argument("--image-layers", type=training.POSITIVE, default=2,
                        help="encoder blocks over the patches (default: %(default)s)")  # fmt: skip
    training.shapes_flags(parser, image_size=48, max_shapes=4, train_images=8192, test_images=1024)
    return parser


def questions(shapes, seed: int) -> dict:
    """One question per picture about a kind drawn at random, as word ids, and its answer."""
    kinds = np.random.default_rng(seed).integers(0, 3, len(shapes.images))
    ids = np.stack([np.asarray([0, 1, 2 + kind, 5], "int32") for kind in kinds])
    return {"images": shapes.images, "question": ids, "kind": kinds,
            "answer": shapes.counts[np.arange(len(kinds)), kinds]}  # fmt: skip


def batch(data: dict, rows) -> tuple:
    return {"images": data["images"][rows].astype("float32") / 255, "question": data["question"][rows]}, data[
        "answer"][rows]  # fmt: skip


def build_model(args):
    """Patches through encoder blocks; the question's words through decoder blocks that attend to the patches."""
    import keras

    from keras_tfm import layers

    width = args.hidden_dim or 64
    heads, depth, feed_forward = args.num_heads or 4, args.num_layers or 2, args.intermediate_dim or 2 * width
    images = keras.Input((args.image_size, args.image_size, 3), name="images")
    question = keras.Input((len(WORDS) - 2,), dtype="int32", name="question")
    grid = 8  # 8 x 8 patches whatever the picture's size
    patches = layers.PatchEmbedding(args.image_size // grid, width)(images)
    patches = patches + layers.SinusoidalPositionEncoding2D()(patches, grid_shape=(grid, grid))
    for _ in range(args.image_layers):
        patches = layers.EncoderBlock(heads, feed_forward, dropout=args.dropout or 0.0)(patches)
    patches = keras.layers.Identity(name="image_tokens")(patches)  # named: `draw_attention` reads them
    words = layers.TokenEmbedding(len(WORDS), width)(question)
    words = words + layers.LearnedPositionEmbedding(len(WORDS) - 2)(words)
    for index in range(depth):
        words = keras.layers.Identity(name=f"question_tokens_{index}")(words)
        words = layers.DecoderBlock(heads, feed_forward, use_cross_attention=True, dropout=args.dropout or 0.0,
                                    name=f"question_block_{index}")(words, patches, use_causal_mask=False)  # fmt: skip
    answers = keras.layers.Dense(args.max_shapes + 1, name="answer")(keras.layers.LayerNormalization()(words[:, -1]))
    return keras.Model({"images": images, "question": question}, answers, name="counter")


def question_only_accuracy(train: dict, test: dict) -> float:
    """The test accuracy of answering each question with its most frequent training answer: the best any model
    that does not see the picture can do on average."""
    best = [np.bincount(train["answer"][train["kind"] == kind]).argmax() for kind in range(3)]
    return float(np.mean(np.asarray(best)[test["kind"]] == test["answer"]))


def draw_attention(model, test: dict, args) -> str:
    """attention_maps.png: four test pictures, and where the last question block's "?" looked, per head."""
    import keras

    from keras_tfm import viz

    inputs, _ = batch(test, slice(0, 4))
    last = (args.num_layers or 2) - 1
    reads = keras.Model(model.inputs, [model.get_layer(f"question_tokens_{last}").output,
                                       model.get_layer("image_tokens").output])  # fmt: skip
    words, patches = reads(inputs)
    _, _, cross = model.get_layer(f"question_block_{last}")(words, patches, use_causal_mask=False,
                                                             return_attention_weights=True)  # fmt: skip
    weights = keras.ops.convert_to_numpy(cross)[:, :, -1]  # (pictures, heads, patches) of the last word
    texts = [f"{' '.join(WORDS[i] for i in row)} {answer}" for row, answer in zip(test["question"][:4], test["answer"])]
    return viz.plot_query_attention(test["images"][:4], weights, texts, f"{args.output_dir}/attention_maps.png")


if __name__ == "__main__":
    from keras_tfm.training import run_main

    run_main(main)
