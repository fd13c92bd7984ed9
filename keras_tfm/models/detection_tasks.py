"""What a person does with a detection model, images in as files, PIL images or arrays: boxes in each image's own
pixels with their classes and scores (`detect`), as transformers' `post_process_object_detection` gives them."""

from __future__ import annotations

from keras import ops

from keras_tfm.detection import detections
from keras_tfm.errors import InputError
from keras_tfm.layers.arguments import is_number
from keras_tfm.models.image_tasks import ImageTasks, one_image
from keras_tfm.models.segmentation_tasks import image_height_width


class DetectionTasks:
    """For a model with `image_processor`, `include_top`, `class_names` and outputs `{"logits", "pred_boxes"}`."""

    preprocess_images = ImageTasks.preprocess_images

    def detect(self, images, threshold: float = 0.5) -> list:
        """Each image's objects scoring over `threshold`: `{"scores", "labels", "boxes", "names"}`, boxes as
        `(x0, y0, x1, y1)` in the image's own pixels, `names` the labels' `class_names`. Each image is prepared
        alone (a processor that keeps the aspect gives each its own size). One image: its dict alone.

        Example: `keras_tfm.from_huggingface("hustvl/yolos-tiny").detect("street.jpg", threshold=0.9)`."""
        if not getattr(self, "include_top", False):
            raise InputError("a model without its head (include_top=False) detects nothing; load it with its "
                             "detection head.", caller="detect")  # fmt: skip
        if not is_number(threshold) or not 0 <= threshold < 1:
            raise InputError(f"expected a score in [0, 1); received {threshold!r}.", "threshold", "detect")
        single = one_image(images)
        found = []
        for image in [images] if single else images:
            outputs = self.predict_on_batch(self.preprocess_images([image]))
            logits, boxes = (ops.convert_to_numpy(outputs[key]) for key in ("logits", "pred_boxes"))
            result = detections(logits, boxes, [image_height_width(image)], threshold)[0]
            found.append({**result, "names": [self.class_names[label] for label in result["labels"]]})
        return found[0] if single else found
