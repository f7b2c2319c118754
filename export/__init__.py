"""irpe.export."""
