"""iRPE DeiT models: bucket tables, RPE modules, the registry and safe checkpoint loading."""

from .buckets import RPEMethod, bucket_ids, num_buckets, piecewise_index
from .checkpoint import CheckpointError, CheckpointInfo, load_checkpoint, load_checkpoint_with_info, read_checkpoint
from .deit import VisionTransformer, ViTConfig
from .infer import InferenceError, infer_config
from .registry import create_model, get_config, list_models, released_models
from .rpe import RPEConfig, RPEMode, RPETargets

__all__ = [
    "CheckpointError", "CheckpointInfo", "InferenceError", "RPEConfig", "RPEMethod", "RPEMode", "RPETargets",
    "ViTConfig", "VisionTransformer", "bucket_ids", "create_model", "get_config", "infer_config", "list_models",
    "load_checkpoint", "load_checkpoint_with_info", "num_buckets", "piecewise_index", "read_checkpoint",
    "released_models",
]
