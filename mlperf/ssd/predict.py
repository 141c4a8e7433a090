"""Detect objects in image files with a trained SSD: the eval's view and its on-device
NMS, batch by batch.

Each image is resized whole to the model's square input and normalised as the eval set
is (`eval_view`); `SsdTask.eval_outputs` decodes the boxes and keeps the NMS survivors
(config.eval's pre-NMS top-k, IoU threshold, score threshold and detection count); the
boxes come back in the image's own pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from input_pipeline.detection_augment import eval_view
from mlperf.batch_inference import BatchRunner
from mlperf.detection_predict import Detections, InputImage, record_of
from mlperf.ssd.boxes import to_pixel_xywh


class SsdDetector:
    """A TrainedModel's SSD over image files."""

    def __init__(self, trained):
        self.size = trained.task.anchors.image_size
        self.runner = BatchRunner(trained, trained.task.eval_outputs)

    def detect(
        self,
        images: Sequence[InputImage],
        batch_size: int,
        progress: Callable[[int], None] | None = None,
    ) -> list[Detections]:
        """Every image's detections (input order), `batch_size` images per batch;
        `progress(1)` after each image."""
        rows = self.runner.batch_size(batch_size)
        examples = ({"image": eval_view(record_of(im), self.size)} for im in images)
        out = []
        for im, o in zip(images, self.runner.run(examples, rows), strict=True):
            keep = o["scores"] > 0  # filled NMS slots
            w, h = np.asarray(im.width), np.asarray(im.height)
            xywh = to_pixel_xywh(o["boxes"][keep], w, h).astype(np.float32)
            out.append(Detections(im, xywh, o["scores"][keep], o["classes"][keep]))
            if progress is not None:
                progress(1)
        return out
