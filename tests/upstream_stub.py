"""A local upstream for tests: an OpenAI-compatible completions API that answers 200 with a
fixed completion, 429 with ``Retry-After``, or nothing in time (``hang``), switchable while it
runs. GET and POST answer alike (``raytpu submit`` checks a Ray head with a GET)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODES = ("ok", "429", "hang")
COMPLETION = "from the fallback"


class Upstream:
    """``mode``: one of :data:`MODES`; ``calls`` counts the requests it got."""

    def __init__(self, mode: str = "ok", retry_after: int = 3, hang_s: float = 15.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} is not valid; valid: {', '.join(MODES)}")
        self.mode, self.calls = mode, 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream.calls += 1
                if upstream.mode == "hang":
                    time.sleep(hang_s)  # longer than any client bound in the tests
                status = 200 if upstream.mode == "ok" else 429
                payload = {"choices": [{"index": 0, "text": COMPLETION}]}
                body = json.dumps(payload if status == 200 else {"error": "busy"}).encode()
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", str(retry_after))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = self.address + "/v1"
        """The OpenAI API base (``FallbackConfig.url``)."""


@contextmanager
def upstream_stub(mode: str = "ok", **options: float) -> Iterator[Upstream]:
    """An :class:`Upstream` serving on a free port until the block ends."""
    upstream = Upstream(mode, **options)  # type: ignore[arg-type]
    thread = threading.Thread(target=upstream.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield upstream
    finally:
        upstream.server.shutdown()
        upstream.server.server_close()
        thread.join(timeout=5)
