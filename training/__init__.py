"""irpe.training: train iRPE DeiT (digits builtin or ImageFolder), visualise bucket maps."""
