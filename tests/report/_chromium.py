"""Open an HTML file in headless Chromium over the DevTools protocol and record what a person's
browser would: console errors, network requests, dialogs, and a screenshot."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        return f"{CHROMIUM} is absent: apt-get install chromium (.ci/run does it as root)"
    try:
        import websocket  # noqa: F401
    except ImportError:
        return "websocket-client is absent: pip install -e '.[dev]'"
    return None


@dataclass
class PageVisit:
    """What happened while a page loaded and drew its charts."""

    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    charts_expected: int = 0
    charts_drawn: int = 0
    title: str = ""
    text: str = ""
    png: bytes = b""
    #: What ``probe`` (a JavaScript expression returning JSON-able data) gave once the charts were drawn.
    probed: Any = None

    @property
    def external_requests(self) -> list[str]:
        """Requests that leave the file: anything not file:, data:, blob: or about:."""
        return [u for u in self.requests if not u.startswith(("file:", "data:", "blob:", "about:"))]


class _Devtools:
    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _send(self, method: str, params: dict[str, Any]) -> int:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        return self.next_id

    def _note(self, msg: dict[str, Any]) -> None:
        self.events.append(msg)
        if msg.get("method") == "Page.javascriptDialogOpening":  # a dialog blocks the page: close it
            self._send("Page.handleJavaScriptDialog", {"accept": True})

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = self._send(method, params)
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result") or {})
            if "method" in msg:
                self._note(msg)

    def wait_event(self, method: str, timeout: float) -> dict[str, Any] | None:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + timeout
        self.ws.settimeout(1.0)
        try:
            while time.monotonic() < deadline:
                try:
                    msg = json.loads(self.ws.recv())
                except Exception as exc:  # the socket's timeout: poll again until the deadline
                    if "timed out" in str(exc).lower():
                        continue
                    raise
                if "method" not in msg:
                    continue
                self._note(msg)
                if msg.get("method") == method:
                    return msg
        finally:
            self.ws.settimeout(60)
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()


@contextlib.contextmanager
def chromium() -> Iterator[str]:
    """A headless Chromium with a new empty profile; yields its DevTools HTTP address."""
    profile = tempfile.mkdtemp(prefix="proftune-chromium-")
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
                             "--remote-debugging-address=127.0.0.1", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        shutil.rmtree(profile, ignore_errors=True)


def visit(base: str, path: Path | str, *, width: int = 1280, height: int = 900, timeout: float = 60,
          probe: str | None = None) -> PageVisit:
    """Load ``path`` from file:// (or a URL, given as text) in a new tab; wait until every chart is
    drawn; record it all."""
    req = urllib.request.Request(f"{base}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(req, timeout=30) as resp:
        target = json.loads(resp.read())
    dt = _Devtools(target["webSocketDebuggerUrl"])
    out = PageVisit()
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            dt.call(f"{domain}.enable")
        dt.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        dt.call("Page.navigate", url=path if isinstance(path, str) else path.resolve().as_uri())
        if dt.wait_event("Page.loadEventFired", timeout) is None:
            raise RuntimeError(f"{path} did not finish loading in {timeout} s")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = dt.call("Runtime.evaluate", returnByValue=True, expression=(
                "JSON.stringify([document.querySelectorAll('script[data-chart]').length,"
                "document.querySelectorAll('.chart .main-svg').length > 0 ? "
                "Array.prototype.filter.call(document.querySelectorAll('.chart'),"
                "function(d){return d.querySelector('.main-svg')}).length : 0])"))
            expected, drawn = json.loads(state["result"]["value"])
            out.charts_expected, out.charts_drawn = expected, drawn
            if drawn >= expected:
                break
            time.sleep(0.2)
        info = dt.call("Runtime.evaluate", returnByValue=True,
                       expression="JSON.stringify([document.title, document.body.innerText])")
        out.title, out.text = json.loads(info["result"]["value"])
        if probe is not None:
            got = dt.call("Runtime.evaluate", returnByValue=True, expression=f"JSON.stringify({probe})")
            out.probed = json.loads(got["result"]["value"])
        shot = dt.call("Page.captureScreenshot", format="png")
        out.png = base64.b64decode(shot["data"])
        dt.wait_event("__drain__", 0.5)
        for ev in dt.events:
            method, params = ev.get("method"), ev.get("params") or {}
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                   for a in params.get("args") or []))
            elif method == "Runtime.exceptionThrown":
                out.exceptions.append(str((params.get("exceptionDetails") or {}).get("text")))
            elif method == "Log.entryAdded" and (params.get("entry") or {}).get("level") == "error":
                out.console_errors.append(str(params["entry"].get("text")))
            elif method == "Network.requestWillBeSent":
                out.requests.append(str((params.get("request") or {}).get("url")))
            elif method == "Page.javascriptDialogOpening":
                out.dialogs.append(str(params.get("message")))
    finally:
        dt.close()
        with contextlib.suppress(Exception):
            urllib.request.urlopen(f"{base}/json/close/{target['id']}", timeout=10).close()
    return out
