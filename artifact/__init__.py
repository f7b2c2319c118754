"""The artifact contract (model.json), torch-free: written by ``irpe.export``, read by ``irpe.server``."""

from .schema import (
    ARTIFACT_FORMAT_VERSION,
    ArtifactError,
    FitMode,
    Interpolation,
    InvertMode,
    ModelArtifact,
    Preprocess,
    file_sha256,
    load_artifact,
    save_artifact,
)

__all__ = [
    "ARTIFACT_FORMAT_VERSION",
    "ArtifactError",
    "FitMode",
    "Interpolation",
    "InvertMode",
    "ModelArtifact",
    "Preprocess",
    "file_sha256",
    "load_artifact",
    "save_artifact",
]
