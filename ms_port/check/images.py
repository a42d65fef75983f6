"""Real images as verify's input (``--input photo.jpg`` or ``--input images/``), prepared as
the target model expects.

A randomly initialised or barely trained network can be insensitive to noise inputs
(INCONCLUSIVE); real images are what its users feed. Each image is decoded with Pillow (a
well-kept decoder; its decompression-bomb guard is kept at :data:`MAX_PIXELS`), converted
to RGB, resized to the input's height and width (bilinear), and scaled:

- a detector (``mindyolo:``): to [0, 1], as MindYOLO's and ultralytics' pipelines feed
  their networks (both letterbox first; a plain resize keeps every pixel an image pixel);
- a classifier (``mindcv:``, ``--arch``, anything else): to [0, 1], then normalised with
  ImageNet's mean and standard deviation, as MindCV, timm and torchvision models expect.

The report's input line says which. A folder gives a batch of its images, in name order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MsPortError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
#: the largest image decoded (Pillow's own guard, set here: 8192 × 8192)
MAX_PIXELS = 8192 * 8192
#: the most images of a folder fed as one batch
MAX_IMAGES = 64
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageError(MsPortError):
    """An image input is unusable; the message names the file and the fix."""


@dataclass(frozen=True)
class Preparation:
    """How images become the input: its size and scaling, and the words for the report."""

    height: int
    width: int
    normalise: bool  # ImageNet mean/std after scaling to [0, 1]
    why: str

    def describe(self) -> str:
        scale = ("scaled to [0, 1] and normalised with ImageNet's mean and std"
                 if self.normalise else "scaled to [0, 1]")
        return f"RGB, resized to {self.height}×{self.width}, {scale} ({self.why})"


def is_images(path: str | Path) -> bool:
    """Whether ``path`` is an image file or a folder holding images."""
    path = Path(path)
    if path.is_dir():
        return any(p.suffix.lower() in IMAGE_SUFFIXES for p in path.iterdir())
    return path.suffix.lower() in IMAGE_SUFFIXES


def preparation(shape: Any, ms_model: Any) -> Preparation:
    """For an input shape ``(3, H, W)`` and the target: a detector's scaling or a
    classifier's normalisation."""
    if shape is None or len(shape) != 3 or shape[0] != 3:
        raise ImageError(f"image inputs need a 3-channel input shape (3,H,W), not "
                         f"{shape}: pass --input-shape 3,H,W")
    detector = isinstance(ms_model, str) and ms_model.startswith("mindyolo:")
    why = ("a MindYOLO detector" if detector else "a classifier's ImageNet preprocessing")
    return Preparation(int(shape[1]), int(shape[2]), not detector, why)


def load_images(path: str | Path, prep: Preparation) -> tuple[np.ndarray, list[str]]:
    """The images at ``path`` (a file, or a folder's images in name order) as one float32
    batch ``N×3×H×W``, and their file names.

    Raises:
        ImageError: no image there, more than :data:`MAX_IMAGES`, an image Pillow cannot
            decode (naming it), or one larger than :data:`MAX_PIXELS`.
    """
    try:
        from PIL import Image
    except ImportError:
        raise ImageError("image inputs need Pillow: pip install pillow") from None
    path = Path(path)
    files = (sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES
                    and p.is_file()) if path.is_dir() else [path])
    if not files:
        raise ImageError(f"{path}: no image ({', '.join(IMAGE_SUFFIXES)}) to feed")
    if len(files) > MAX_IMAGES:
        raise ImageError(f"{path}: {len(files)} images; at most {MAX_IMAGES} are fed as one "
                         "batch — give a folder of fewer")
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    batch = []
    for file in files:
        try:
            with Image.open(file) as image:
                rgb = image.convert("RGB").resize((prep.width, prep.height),
                                                  Image.Resampling.BILINEAR)
                batch.append(np.asarray(rgb, dtype=np.float32) / 255.0)
        except Exception as exc:  # a decoder on untrusted bytes (and on Pillow as others
            # patched it: ultralytics wraps Image.open): any failure is "not an image"
            raise ImageError(f"{file}: not an image Pillow can decode ({type(exc).__name__}: "
                             f"{exc}); check the file", path=file) from None
    array = np.stack(batch).transpose(0, 3, 1, 2)
    if prep.normalise:
        mean = np.asarray(IMAGENET_MEAN, np.float32)[None, :, None, None]
        std = np.asarray(IMAGENET_STD, np.float32)[None, :, None, None]
        array = (array - mean) / std
    return np.ascontiguousarray(array, dtype=np.float32), [f.name for f in files]


__all__ = ["IMAGE_SUFFIXES", "ImageError", "Preparation", "is_images", "load_images",
           "preparation"]
