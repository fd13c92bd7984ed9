"""What a person does with a depth model, images in as files, PIL images or arrays: a depth map per image at the
image's own size (`estimate_depth`), as transformers' `post_process_depth_estimation` makes it."""

from __future__ import annotations

from keras import ops

from keras_tfm.layers.resizing import resize_maps
from keras_tfm.models.image_tasks import ImageTasks, one_image
from keras_tfm.models.segmentation_tasks import predictions_per_image


class DepthTasks:
    """For a model with `image_processor` and depths `(batch, h, w)` from `predict_on_batch`."""

    preprocess_images = ImageTasks.preprocess_images

    def estimate_depth(self, images, batch_size: int = 8):
        """Each image's depth map `(height, width)` float32 at the image's own size: the prediction resized
        bicubically to it (relative depth models give disparity: larger is nearer). One image: its map alone.

        Example: `keras_tfm.from_huggingface("depth-anything/Depth-Anything-V2-Small-hf").estimate_depth("room.jpg")`."""
        single = one_image(images)
        maps = [ops.convert_to_numpy(resize_maps(row[None, :, :, None], size, "bicubic"))[0, :, :, 0]
                for row, size in predictions_per_image(self, [images] if single else images, batch_size)]  # fmt: skip
        return maps[0] if single else maps
