"""Request bodies bounded before they are read: ``CHORDBEAT_WEB_MAX_BODY_BYTES``.

Tornado reads a request's whole body into memory before any handler (and the login) sees it, up
to its own 100 MB default: an anonymous 60 MB ``POST /login`` raised the dashboard's memory from
86 to 206 MB. :class:`BoundedBodies` stands between the HTTP server and the application: a body
announced longer than the limit (``Content-Length``) is answered 413 from its headers, none of it
kept, and every other request's connection reads at most the limit (a chunked body past it is
refused by tornado with 400 before the chunk that crosses it is read).

After a 413 the connection is closed gently: the answer is sent, the sending side shut, and what
the client still sends is read and dropped for a moment. Closing at once with unread data in the
socket resets the connection, and a client still sending its body (``requests`` does) loses the
answer with it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable

from tornado import gen, httputil, iostream
from tornado.http1connection import HTTP1Connection

logger = logging.getLogger(__name__)

#: How long a refused client may go on sending (read and dropped) before its connection is closed.
LINGER_S = 2.0
_DROP_CHUNK = 64 * 1024
_TOO_LARGE = b"request body too large\n"


class BoundedBodies(httputil.HTTPServerConnectionDelegate):
    """Wraps the dashboard's application for its HTTP server."""

    def __init__(self, application: httputil.HTTPServerConnectionDelegate, max_body_bytes: int) -> None:
        self.application = application
        self.max_body_bytes = max_body_bytes

    def start_request(self, server_conn: object, request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        delegate = self.application.start_request(server_conn, request_conn)
        return _BoundedRequest(delegate, request_conn, self.max_body_bytes)

    def on_close(self, server_conn: object) -> None:
        self.application.on_close(server_conn)


class _BoundedRequest(httputil.HTTPMessageDelegate):
    def __init__(
        self, delegate: httputil.HTTPMessageDelegate, connection: httputil.HTTPConnection, max_body_bytes: int
    ) -> None:
        self.delegate = delegate
        self.connection = connection
        self.max_body_bytes = max_body_bytes
        self.refused = False

    def headers_received(
        self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine, headers: httputil.HTTPHeaders
    ) -> Awaitable[None] | None:
        length = headers.get("Content-Length", "")
        # A malformed length is left to tornado, which refuses it (400).
        if length.isascii() and length.isdigit() and int(length) > self.max_body_bytes:
            self.refused = True
            return self._refuse(int(length))
        if isinstance(self.connection, HTTP1Connection):
            self.connection.set_max_body_size(self.max_body_bytes)
        return self.delegate.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        return self.delegate.data_received(chunk)

    def finish(self) -> None:
        self.delegate.finish()

    def on_connection_close(self) -> None:
        if not self.refused:
            self.delegate.on_connection_close()

    async def _refuse(self, length: int) -> None:
        assert isinstance(self.connection, HTTP1Connection)
        stream = self.connection.detach()  # tornado reads no body from a detached connection
        logger.warning(
            "web: a request body of %d bytes refused (CHORDBEAT_WEB_MAX_BODY_BYTES is %d)", length, self.max_body_bytes
        )
        head = (
            "HTTP/1.1 413 Payload Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(_TOO_LARGE)}\r\nConnection: close\r\n\r\n"
        )
        try:
            await stream.write(head.encode() + _TOO_LARGE)
            stream.socket.shutdown(socket.SHUT_WR)
            deadline = stream.io_loop.time() + LINGER_S
            while True:
                read = stream.read_bytes(_DROP_CHUNK, partial=True)
                await gen.with_timeout(deadline, read, quiet_exceptions=iostream.StreamClosedError)
        except (iostream.StreamClosedError, OSError, TimeoutError):
            pass
        finally:
            stream.close()
