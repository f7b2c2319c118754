"""irpe.server."""
