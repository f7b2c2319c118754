"""irpe-deploy: export and serve vision transformers with image relative position encoding."""

__version__ = "0.1.0"
