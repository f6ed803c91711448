"""A headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``).

No websocket client is needed: the browser reads NUL-terminated JSON commands on fd 3 and
answers on fd 4. Used by the report tests to load pages from file:// URLs, evaluate
JavaScript in them and take screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary on PATH, or None."""
    return next((p for p in map(shutil.which, NAMES) if p), None)


def _as_fds_3_and_4(read_end: int, write_end: int) -> None:
    """In the child: put the pipe ends on fds 3 and 4 (moved up first so neither clobbers
    the other when one of them already is 3 or 4)."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (read_end, write_end)]
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)


class Browser:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child must see the pipe ends as fds 3 and 4, and nothing else of ours.
        self._proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",  # CI runs as root
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile.name}",
                "--window-size=1280,1000",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=lambda: _as_fds_3_and_4(to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.send("Browser.close")
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, session: bool = False, **params: Any) -> dict:
        """Send one DevTools command and return its result (events are kept in .events)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def open(self, url: str) -> None:
        """Navigate to ``url`` and wait for its load event (images included)."""
        self.events.clear()
        result = self.send("Page.navigate", session=True, url=url)
        if result.get("errorText"):
            raise RuntimeError(f"cannot open {url}: {result['errorText']}")
        self._wait_event("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises awaited) in the page."""
        result = self.send(
            "Runtime.evaluate",
            session=True,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"javascript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the whole page at ``path``."""
        data = self.send(
            "Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True
        )["data"]
        path.write_bytes(base64.b64decode(data))
        return path
