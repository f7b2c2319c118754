"""The HTTP floor of ``irpe bench serve --frontend``: uvicorn (httptools, uvloop) with an ASGI app that reads
the upload and answers a fixed /classify-sized JSON; no routing, no decode, no model.

``python empty_asgi.py PORT``; answers 200 on every path (also /readyz, so the bench's start-up wait works).
"""

from __future__ import annotations

import sys
from typing import Any

ANSWER = (b'{"model":"floor","predictions":[[{"index":3,"label":"3","probability":0.25},{"index":1,"label":"1",'
          b'"probability":0.2}]],"timing_ms":{"decode":1.0,"queue":0.1,"inference":0.5,"total":2.0},"batch_size":1}')


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the whole body, answer ANSWER."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", http="httptools",
                loop="uvloop", access_log=False)
