"""HTTP/1.1 responses read raw off a socket: status, headers, body, one by one."""

from __future__ import annotations

import socket

__all__ = ["Response", "read_response", "read_responses"]

#: A response: its status, its headers (lower-case names) and its body.
Response = tuple[int, dict[str, str], bytes]


def read_responses(sock: socket.socket, count: int) -> list[Response]:
    """``count`` HTTP/1.1 responses off ``sock``, in order (blocks until they are whole).

    Responses that arrive in one read (pipelined requests) are kept apart.

    Raises:
        ConnectionError: the connection closed before they were whole.
    """
    data = b""
    out: list[Response] = []
    while len(out) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            lines = data[:end].decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            stop = end + 4 + int(headers.get("content-length", "0"))
            if len(data) >= stop:
                out.append((int(lines[0].split()[1]), headers, data[end + 4 : stop]))
                data = data[stop:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed after {len(out)} whole responses")
        data += chunk
    return out


def read_response(sock: socket.socket) -> Response:
    """One HTTP/1.1 response off ``sock`` (see :func:`read_responses`)."""
    return read_responses(sock, 1)[0]
