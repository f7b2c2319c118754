"""gRPC server reflection (``grpc.reflection.v1alpha.ServerReflection``) over the services this server answers.

Reflection answers from a descriptor pool of its own that holds only the files of the services it lists
(``grpc_service.proto`` with ``model_config.proto``, ``grpc/health/v1/health.proto`` and the reflection proto)
rather than protobuf's default pool, which holds every message the process happens to import. It reveals the
protocol's schema and nothing of the models served: ``grpcurl -plaintext HOST:8001 list`` and ``describe``.

A method's name (``inference.GRPCInferenceService.ModelInfer``, what ``grpcurl describe`` of a method asks
for) resolves to its service's file: protobuf's descriptor pool finds messages, fields and services by name,
not methods, so the stock servicer answered NOT_FOUND for them.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

from .handlers import GenericOnly

REFLECTION_SERVICE = reflection.SERVICE_NAME  # grpc.reflection.v1alpha.ServerReflection


class ServedReflection(reflection.aio.ReflectionServicer):
    """grpcio-reflection's asyncio servicer, with method names resolved (see the module docstring)."""

    def _file_containing_symbol(self, request: reflection_pb2.ServerReflectionRequest,
                                fully_qualified_name: str) -> reflection_pb2.ServerReflectionResponse:
        service_name, _, method = fully_qualified_name.rpartition(".")
        try:
            if method in self._pool.FindServiceByName(service_name).methods_by_name:
                fully_qualified_name = service_name
        except KeyError:
            pass  # not a method: looked up as it is
        return super()._file_containing_symbol(request, fully_qualified_name)


def _add_file(pool: descriptor_pool.DescriptorPool, file: FileDescriptor, added: set[str]) -> None:
    """Add ``file`` to ``pool`` after its dependencies (each file once)."""
    if file.name in added:
        return
    for dependency in file.dependencies:
        _add_file(pool, dependency, added)
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    pool.Add(proto)
    added.add(file.name)


def served_pool(service_names: Iterable[str]) -> descriptor_pool.DescriptorPool:
    """A descriptor pool holding the files that define ``service_names`` and what they import.

    Args:
        service_names: fully qualified service names whose generated modules are imported.

    Returns:
        A new pool with just those files.

    Raises:
        KeyError: a service whose generated module was not imported (its file is not in the default pool).
    """
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    for name in service_names:
        _add_file(pool, descriptor_pool.Default().FindFileContainingSymbol(name), added)
    return pool


def add_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> None:
    """Add server reflection listing ``service_names`` and itself to a gRPC server not yet started.

    Args:
        server: the gRPC server.
        service_names: the fully qualified services the server answers besides reflection.
    """
    names = [*service_names, REFLECTION_SERVICE]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(ServedReflection(names, pool=served_pool(names)),
                                                               GenericOnly(server))
