"""Detect and segment objects in image files with a trained Mask R-CNN: the eval's
resize-and-pad view, `MaskRcnnTask.eval_outputs` (proposals, box head, per-class NMS,
mask head) and its post-processing (boxes back to the image's pixels, masks pasted at
its size), batch by batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from input_pipeline.maskrcnn_data import make_example
from mlperf.batch_inference import BatchRunner
from mlperf.detection_predict import Detections, InputImage, record_of
from mlperf.maskrcnn.postprocess import image_boxes, paste_masks, yxyx_to_xywh


class MaskRcnnDetector:
    """A TrainedModel's Mask R-CNN over image files."""

    def __init__(self, trained):
        self.input = trained.task.input_params()
        self.runner = BatchRunner(trained, trained.task.eval_outputs)

    def _example(self, image: InputImage) -> tuple[dict[str, np.ndarray], float]:
        example = make_example(record_of(image), self.input, flip=False, train=False)
        return {"image": example["image"], "image_hw": example["image_hw"]}, float(example["scale"])

    def detect(
        self,
        images: Sequence[InputImage],
        batch_size: int,
        progress: Callable[[int], None] | None = None,
    ) -> list[Detections]:
        """Every image's detections with full-image masks (input order); `progress(1)`
        after each image."""
        rows = self.runner.batch_size(batch_size)
        scales: list[float] = []

        def examples():
            for im in images:
                example, scale = self._example(im)
                scales.append(scale)
                yield example

        out = []
        outputs = self.runner.run(examples(), rows)
        for i, (im, o) in enumerate(zip(images, outputs, strict=True)):
            keep = np.asarray(o["valid"], bool)
            yxyx = image_boxes(o["boxes"][keep], scales[i], im.height, im.width)
            masks = paste_masks(o["masks"][keep], yxyx, im.height, im.width)
            out.append(
                Detections(im, yxyx_to_xywh(yxyx), o["scores"][keep], o["classes"][keep], masks)
            )
            if progress is not None:
                progress(1)
        return out
