"""Training data: a tiny PIL ImageFolder and what every dataset shares (``DataBundle``, normalisation).

:mod:`.datasets` picks one for ``--data``; the builtin ``digits`` is in :mod:`.digits`.

Evaluation tensors are made by :func:`irpe.artifact.preprocess.preprocess_image` itself, so what the
model sees in validation is exactly what the server feeds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from irpe.artifact.preprocess import preprocess_image
from irpe.artifact.schema import Preprocess

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".tif", ".tiff")


@dataclass
class DataBundle:
    """Train/val datasets plus what the checkpoint must record about them."""

    train: Dataset
    val: Dataset
    class_names: list[str]
    preprocess: Preprocess


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float32 (3, H, W) in [0, 1] (same arithmetic as preprocess_image)."""
    arr = np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
    return torch.from_numpy(np.ascontiguousarray(arr))


def normalize(x: torch.Tensor, pp: Preprocess) -> torch.Tensor:
    """(x - mean) / std per channel, float32."""
    mean = torch.tensor(pp.mean, dtype=torch.float32)[:, None, None]
    std = torch.tensor(pp.std, dtype=torch.float32)[:, None, None]
    return (x - mean) / std


def scan_image_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Sorted class folders of ``root`` and every (image path, class index) beneath them."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such directory; expected an ImageFolder split root/<class>/*.jpg")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    samples = [(p, i) for i, c in enumerate(classes) for p in sorted((root / c).rglob("*"))
               if p.suffix.lower() in IMAGE_EXTENSIONS]
    if not samples:
        raise FileNotFoundError(f"{root}: no images found under {root}/<class>/ "
                                f"(extensions {', '.join(IMAGE_EXTENSIONS)})")
    return classes, samples


def random_resized_crop_box(w: int, h: int, scale: tuple[float, float] = (0.08, 1.0),
                            ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (left, top, right, bottom), drawn from torch's RNG."""
    area = w * h
    for _ in range(10):
        target = area * float(torch.empty(1).uniform_(*scale))
        log_r = (math.log(ratio[0]), math.log(ratio[1]))
        aspect = math.exp(float(torch.empty(1).uniform_(*log_r)))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            top = int(torch.randint(0, h - ch + 1, (1,)))
            left = int(torch.randint(0, w - cw + 1, (1,)))
            return left, top, left + cw, top + ch
    side = min(w, h)  # fallback: centre crop
    left, top = (w - side) // 2, (h - side) // 2
    return left, top, left + side, top + side


class ImageFolder(Dataset):
    """``root/<class>/*.jpg``; train mode: random resized crop + flip, eval mode: the serving transform."""

    def __init__(self, root: str | Path, pp: Preprocess, train: bool,
                 classes: list[str] | None = None) -> None:
        self.root = Path(root)
        found, self.samples = scan_image_folder(self.root)
        self.classes = classes or found
        if classes is not None and found != classes:
            raise ValueError(f"{self.root}: class folders {found} differ from the train split's {classes}")
        self.pp, self.train = pp, train

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as im:
            img = im.convert("RGB")
        if not self.train:
            return torch.from_numpy(preprocess_image(img, self.pp)), label
        img = img.crop(random_resized_crop_box(*img.size))
        img = img.resize((self.pp.crop, self.pp.crop), Image.BICUBIC)
        if float(torch.rand(1)) < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return normalize(pil_to_tensor(img), self.pp), label


def image_folder(root: str | Path, img_size: int) -> DataBundle:
    """ImageFolder train/val splits with the DeiT evaluation transform (ImageNet mean/std)."""
    root = Path(root)
    pp = Preprocess.for_imagenet(img_size)
    train = ImageFolder(root / "train", pp, train=True)
    val = ImageFolder(root / "val", pp, train=False, classes=train.classes)
    return DataBundle(train, val, list(train.classes), pp)


def unnormalized(pp: Preprocess) -> Preprocess:
    """``pp`` with mean 0 and std 1 (gives [0, 1] pixels)."""
    return replace(pp, mean=(0.0,) * len(pp.mean), std=(1.0,) * len(pp.std))

