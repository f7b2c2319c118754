"""The gRPC front end: ``inference.GRPCInferenceService`` of the KServe v2 / Triton protocol over the same
request pipeline as HTTP (imported only when ``--grpc-port`` is set: it needs the ``grpc`` extra)."""
