"""Debian's Chromium, headless, driven over the DevTools protocol: a page as a person sees it.

:func:`open_browser` starts Chromium (installed by the test set-up when missing) with a
throw-away profile and yields a :class:`Page`: it loads a URL, evaluates JavaScript in it,
takes a screenshot, and records what a person would see in the developer tools: console
errors, uncaught exceptions, failed loads, and every URL the page requested.
"""

from __future__ import annotations

import base64
import contextlib
import json
import pathlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from batchserve_testing.tools import find_chromium


class Page:
    """One browser tab over a DevTools websocket."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.errors: list[str] = []
        self.requested: list[str] = []
        self._id = 0
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
            self.errors.append(f"console.{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"log: {entry['text']} {entry.get('url', '')}")
        elif method == "Network.requestWillBeSent":
            self.requested.append(params["request"]["url"])
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            self.errors.append(f"load failed: {params.get('errorText')}")

    def call(self, method: str, timeout_s: float = 20.0, **params: Any) -> dict[str, Any]:
        """Send one command; events that arrive meanwhile are recorded."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        end = time.monotonic() + timeout_s
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, end - time.monotonic())))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._event(message)

    def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, condition: str, timeout_s: float = 15.0) -> None:
        """Poll a JavaScript condition until it is true.

        Raises:
            TimeoutError: it was still false after ``timeout_s``.
        """
        end = time.monotonic() + timeout_s
        while not self.evaluate(f"Boolean({condition})"):
            if time.monotonic() > end:
                raise TimeoutError(f"still false after {timeout_s}s: {condition}")
            time.sleep(0.05)

    def screenshot(self, path: pathlib.Path, max_height: int | None = None) -> pathlib.Path:
        """Save the whole page as a PNG (its top ``max_height`` pixels, if given)."""
        size = self.evaluate("[document.documentElement.scrollWidth, document.body.scrollHeight]")
        height = max(800, size[1]) if max_height is None else min(max(800, size[1]), max_height)
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=max(1280, size[0]),
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


@contextlib.contextmanager
def open_browser() -> Iterator[Page]:
    """A headless Chromium with one blank tab; closed on exit."""
    binary = find_chromium()
    # Chromium's helper processes may still write the profile as it closes.
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # the tests run as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "--window-size=1280,800",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            port_file = pathlib.Path(profile) / "DevToolsActivePort"
            end = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > end:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"chromium did not start: {err[-2000:]}")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list").json()
            page = next(t for t in targets if t["type"] == "page")
            with connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
                yield Page(ws)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            if proc.stderr is not None:
                proc.stderr.close()
