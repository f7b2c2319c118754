"""The connection-level limits of the gRPC listener, as gRPC core's channel arguments (the names are gRPC
core's ``include/grpc/impl/channel_arg_names.h``), and the message deadline the call gate enforces.

=================================  =====================================  =======================================
limit                              channel argument                       setting
=================================  =====================================  =======================================
message size                       ``grpc.max_receive_message_length``    ``--max-body-mb``
connection cap                     ``grpc.max_allowed_incoming_connections``  ``--max-connections``
streams per connection             ``grpc.max_concurrent_streams``        ``--grpc-max-streams``
handshake (preface + SETTINGS)     ``grpc.server_handshake_timeout_ms``   ``--header-timeout-s``
idle connection (no RPC)           ``grpc.max_connection_idle_ms``        ``--grpc-idle-timeout-s``
connection age, then grace         ``grpc.max_connection_age_ms`` /       ``--grpc-max-age-s`` / ``--timeout-s``
                                   ``grpc.max_connection_age_grace_ms``
headers of a call (all metadata)   ``grpc.max_metadata_size`` /           ``--max-header-kb``
                                   ``grpc.absolute_max_metadata_size``
SETTINGS acknowledged              ``grpc.http2.settings_timeout``        ``--header-timeout-s``
request compression                ``grpc.compression_enabled_algorithms_bitset``  off: identity only
=================================  =====================================  =======================================

gRPC core applies its header limit only once the client has acknowledged the server's SETTINGS, so the call
gate (:mod:`.gate`) checks the same limit on every call itself, and a client that never acknowledges them is
closed after ``--header-timeout-s``. With compression off, a compressed request message is refused by gRPC core
before it is inflated (UNIMPLEMENTED, naming the algorithm); answers are never compressed.

The request message's deadline (``--body-timeout-s``), the key check, the caps on running calls and the bounds
of calls without the key (:mod:`.lanes`) are the call gate's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings

INT_MAX = 2**31 - 1  # gRPC core's "unlimited" for a millisecond argument
IDENTITY_ONLY = 1  # gRPC core's compression bitset: bit 0, identity (no compression), alone
KEYLESS_CALLS = 32  # calls without the key running at once, per process (health probes, ServerLive, ...)
KEYLESS_PER_CONNECTION = 4  # of those, on one connection
KEYLESS_MESSAGE_BYTES = 16 << 10  # the largest request message of a call without the key (a probe's is bytes)
PROBE_RESERVE = 4  # unary probes without the key (health Check, ServerLive, ServerReady) run beyond a full
PROBE_PER_CONNECTION = 1  # keyless lane, per process / on one connection (Kubernetes dials a connection a probe)
PROBE_MESSAGE_S = 1.0  # the most a probe in the reserve waits for its message (a probe sends it with its headers)


def _ms(seconds: float) -> int:
    return min(INT_MAX, max(1, round(seconds * 1000)))


@dataclass(frozen=True)
class GrpcLimits:
    """The gRPC listener's limits, from :class:`Settings` (each one's flag in the module docstring)."""

    max_message_bytes: int
    max_connections: int
    max_streams: int
    handshake_timeout_s: float
    idle_timeout_s: float
    max_age_s: float
    age_grace_s: float
    message_timeout_s: float
    max_metadata_bytes: int
    keyless_message_timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> GrpcLimits:
        """The limits ``settings`` ask for.

        Args:
            settings: the server's settings.

        Returns:
            The gRPC listener's limits.
        """
        return cls(max_message_bytes=settings.max_body_bytes, max_connections=settings.max_connections,
                   max_streams=settings.grpc_max_streams, handshake_timeout_s=settings.header_timeout_s,
                   idle_timeout_s=settings.grpc_idle_timeout_s, max_age_s=settings.grpc_max_age_s,
                   age_grace_s=settings.timeout_s + 5, message_timeout_s=settings.body_timeout_s,
                   max_metadata_bytes=settings.max_header_kb * 1024,
                   keyless_message_timeout_s=min(settings.header_timeout_s, settings.body_timeout_s))

    def channel_options(self, reuse_port: bool) -> list[tuple[str, int]]:
        """gRPC core's channel arguments for these limits.

        Args:
            reuse_port: share the port with the other front ends (``SO_REUSEPORT``).

        Returns:
            ``(name, value)`` pairs for ``grpc.aio.server(options=...)``.
        """
        return [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 1 if reuse_port else 0),
                ("grpc.max_allowed_incoming_connections", self.max_connections),
                ("grpc.max_concurrent_streams", self.max_streams),
                ("grpc.server_handshake_timeout_ms", _ms(self.handshake_timeout_s)),
                ("grpc.max_connection_idle_ms", _ms(self.idle_timeout_s)),
                ("grpc.max_connection_age_ms", _ms(self.max_age_s)),
                ("grpc.max_connection_age_grace_ms", _ms(self.age_grace_s)),
                ("grpc.max_metadata_size", self.max_metadata_bytes),
                ("grpc.absolute_max_metadata_size", self.max_metadata_bytes),
                ("grpc.http2.settings_timeout", _ms(self.handshake_timeout_s)),
                ("grpc.compression_enabled_algorithms_bitset", IDENTITY_ONLY)]
