"""``--data``: a builtin dataset name (:mod:`.digits`) or an ImageFolder directory (:mod:`.data`)."""

from __future__ import annotations

from pathlib import Path

from .data import DataBundle, image_folder

BUILTIN = ("digits",)


def load_data(spec: str, img_size: int) -> DataBundle:
    """A builtin dataset name (``digits``) or an ImageFolder directory with train/ and val/."""
    if spec in BUILTIN:
        from .digits import digits_bundle  # renders the digits: only when asked for

        return digits_bundle(img_size)
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"--data {spec!r}: not a builtin ({', '.join(BUILTIN)}) nor a directory "
                                "holding train/<class>/*.jpg and val/<class>/*.jpg")
    return image_folder(path, img_size)
