"""Who may load and unload models (and change the log settings), whatever the protocol, and the thread those
calls run in.

With ``IRPE_ADMIN_KEY`` set, model control needs it (``Bearer <admin key>``; the inference key is not
enough, and the admin key is not an inference key). Without it, model control needs what every other call
needs (the inference key, when one is set), and only on a loopback bind. The HTTP front end also refuses
cross-site browser requests (:mod:`..http.control`).
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

from ..auth import bearer_matches
from ..config import Settings, is_loopback
from ..errors import APIError
from .service import Service


def check_admin(settings: Settings, authorization: str, what: str = "model control") -> None:
    """APIError unless ``authorization`` may load and unload models here, or change other server settings
    (``what``, named in the error; see the module docstring)."""
    if settings.admin_key:
        if not bearer_matches(authorization, settings.admin_key):
            raise APIError(403, "forbidden", f"{what} needs the admin key: send 'Authorization: Bearer "
                           "<IRPE_ADMIN_KEY>'", {"WWW-Authenticate": "Bearer"})
        return
    if settings.api_key and not bearer_matches(authorization, settings.api_key):
        raise APIError(401, "unauthorized", "missing or wrong API key; send 'Authorization: Bearer <key>'",
                       {"WWW-Authenticate": "Bearer"})
    if not is_loopback(settings.host):
        raise APIError(403, "forbidden", f"{what} on a non-loopback bind ({settings.host}) needs an admin "
                       "key; restart with IRPE_ADMIN_KEY=<secret> and send 'Authorization: Bearer <secret>'")


async def run_control(service: Service, name: str, load: bool) -> None:
    """Load or unload ``name`` in the control thread (not the loop's default executor, which many slow
    loads would otherwise fill)."""
    await asyncio.get_running_loop().run_in_executor(_control_pool(), service.control, name, load)


@functools.cache
def _control_pool() -> ThreadPoolExecutor:
    """The control thread, made on first use: one thread, as control calls take the host's lock one at a time."""
    return ThreadPoolExecutor(1, thread_name_prefix="irpe-control")
