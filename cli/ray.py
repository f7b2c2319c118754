"""``serve run irpe.ray:app model=DIR [setting=value ...]``: irpe-deploy as a Ray Serve application.

The builder Ray's ``serve run`` / ``serve deploy`` call with the ``setting=value`` arguments (strings): irpe
settings (``model``, ``api_key``, ``max_batch``... as ``irpe serve``'s flags, each also read from the
``IRPE_*`` variables) and Ray's replica and autoscaling knobs (docs/deploy/ray.md). Needs the ``ray`` extra:
``pip install '.[ray]'`` from the irpe-deploy checkout's root.
"""

from __future__ import annotations

from typing import Any


def app(args: dict[str, str]) -> Any:
    """The application for ``serve run irpe.ray:app`` (``args``: Ray's ``key=value`` arguments).

    Args:
        args: irpe settings and Ray's knobs, as strings.

    Returns:
        The bound Ray Serve application.

    Raises:
        ValueError: an unknown or misplaced argument, or a bad setting (one line naming the fix).
        ArtifactError: a bad artifact or repository.
    """
    from irpe.server.hosting.ray_serve import build_app

    return build_app(args)
