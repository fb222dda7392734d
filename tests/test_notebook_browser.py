"""``raytpu notebook --local`` driven by a real browser: headless Chromium (Debian's package,
``make chromium``) over the Chrome DevTools Protocol opens the real JupyterLab, puts the cursor
in a cell and presses Shift+Enter, as a user does.

The cell reserves the simulated v6e 2x2 slice and runs a JAX computation on its host: with the
kernel's Ray token it prints the result. The same cell in a kernel without the token (Ray told
to send none, as a client that never got the token would) is refused by the cluster.

Why CDP over the ``websockets`` client (already installed with Ray's dependencies) and not
Selenium or Playwright: Selenium needs a chromedriver matching Chromium (another package), and
Playwright downloads its own browser build; CDP is what both speak to Chromium underneath, and
needs nothing but the browser.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raytpu import processes

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

CELL = """\
import ray
from raytpu.catalog import shape
from workloads.slices.reservation import reserve_slices

try:
    ray.init(logging_level="ERROR")

    @ray.remote
    def on_host():
        import jax
        import jax.numpy as jnp

        return jax.device_count(), float(jnp.arange(jax.device_count() * 8.0).sum())

    with reserve_slices(shape("v6e", "2x2"), timeout_s=60) as held:
        ref = on_host.options(scheduling_strategy=held.scheduling_strategy(0)).remote()
        count, total = ray.get(ref, timeout=120)
        print("RESULT", held.slice_names[0], count, total)
except Exception as error:
    print("REFUSED", type(error).__name__, str(error)[:200])
finally:
    ray.shutdown()
"""
DROP_TOKEN = """\
import os

os.environ.pop("RAY_AUTH_TOKEN")
os.environ["RAY_AUTH_MODE"] = "disabled"  # send no token at all
print("token dropped")
"""
URL_LINE = re.compile(r"JupyterLab attached to .*: (?P<url>http://127\.0\.0\.1:\d+/lab\?token=\w+)")


def _notebook(path: Path, *cells: str) -> None:
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {
                        "cell_type": "code",
                        "execution_count": None,
                        "id": f"cell{i}",
                        "metadata": {},
                        "outputs": [],
                        "source": source,
                    }
                    for i, source in enumerate(cells)
                ],
                "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``raytpu notebook --local`` as a user runs it; its URL; stopped (with its group) after."""
    root = tmp_path_factory.mktemp("notebooks")
    _notebook(root / "with_token.ipynb", CELL)
    _notebook(root / "without_token.ipynb", DROP_TOKEN, CELL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    command = [sys.executable, "-m", "raytpu_cli", "notebook", "--local", "--root-dir", str(root)]
    log = root / "raytpu.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*command, "--duration", "200"],
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            env=env,
            start_new_session=True,
        )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        url = None
        while url is None and time.monotonic() < deadline and process.poll() is None:
            line = process.stdout.readline()
            match = URL_LINE.search(line)
            url = match["url"] if match else None
        assert url, f"no URL from raytpu notebook: {log.read_text()[-2000:]}"
        yield url, root
    finally:
        processes.stop([process], timeout_s=30)  # SIGTERM: it stops JupyterLab and the cluster
        processes.stop([process], group=True)


class Page:
    """One Chromium tab over CDP: send a command, get its result (events are skipped)."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=30))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"{what}: not within {timeout_s:.0f} s; page text: {self.text()}")

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText.slice(-1500) : ''"))

    def click_element(self, element: str) -> None:
        """A real mouse click in the middle of the element the JS expression ``element`` finds."""
        box = self.evaluate(
            f"(() => {{ const r = ({element}).getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box[0],
                y=box[1],
                button="left",
                clickCount=1,
            )

    def shift_enter(self) -> None:
        """Shift+Enter as a keyboard sends it (keyDown with its text, then keyUp)."""
        key = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "modifiers": 8}
        self.send("Input.dispatchKeyEvent", type="keyDown", text="\r", **key)
        self.send("Input.dispatchKeyEvent", type="keyUp", **key)


@contextlib.contextmanager
def chromium_page() -> Iterator[Page]:
    """Headless Chromium with a throwaway profile; killed (and its profile removed) after."""
    from websockets.sync.client import connect

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "chromium is not installed: run `make chromium` (apt-get install chromium)"
    with tempfile.TemporaryDirectory(prefix="raytpu-chromium-") as profile:
        argv = [
            binary,
            "--headless=new",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "--window-size=1280,1000",
            *(["--no-sandbox"] if os.geteuid() == 0 else []),
            "about:blank",
        ]
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                assert process.poll() is None, f"chromium exited with {process.returncode}"
                assert time.monotonic() < deadline, "chromium opened no DevTools port in 30 s"
                time.sleep(0.1)
            port = port_file.read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.loads(r.read())
            ws_url = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
            with connect(ws_url, max_size=None, open_timeout=10) as ws:
                page = Page(ws)
                page.send("Page.enable")
                page.send("Runtime.enable")
                page.send("Page.bringToFront")
                yield page
        finally:
            processes.stop([process], group=True)


@pytest.fixture
def browser() -> Iterator[Page]:
    """A browser per test: leaving a JupyterLab page with a kernel running opens a
    "leave site?" dialog that would block the next test's navigation."""
    with chromium_page() as page:
        yield page


def _run_cell(page: Page, index: int, tries: int = 6) -> None:
    """Click into cell ``index`` and press Shift+Enter until its prompt shows it ran or runs
    (``[*]``, ``[1]``): a key pressed while JupyterLab is still settling can be dropped."""
    cell = f"document.querySelectorAll('.jp-NotebookPanel .jp-Cell')[{index}]"
    started = f"/\\[(\\*|\\d+)\\]/.test({cell}.querySelector('.jp-InputPrompt').innerText)"
    for _ in range(tries):
        page.click_element(f"{cell}.querySelector('.cm-content')")
        page.shift_enter()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if page.evaluate(started):
                return
            time.sleep(0.2)
    raise AssertionError(f"cell {index} did not start after {tries} Shift+Enter: {page.text()}")


def _run_cells(page: Page, url: str, notebook: str, cells: int) -> str:
    """Open ``notebook`` in JupyterLab, run its first ``cells`` cells with Shift+Enter from the
    first one; the text of the last cell's output."""
    # ?reset: a fresh workspace, not the last test's tabs (whose cells the selectors would find)
    page.send("Page.navigate", url=url.replace("/lab?", f"/lab/tree/{notebook}?reset&"))
    page.wait_for(
        "document.querySelectorAll('.jp-NotebookPanel .jp-Cell .cm-content').length > 0",
        30,
        f"{notebook} open in JupyterLab",
    )
    page.wait_for(
        "!!document.querySelector('.jp-NotebookPanel .jp-Notebook-ExecutionIndicator"
        '[data-status="idle"]\')',
        30,
        "its kernel idle",
    )
    for index in range(cells):
        _run_cell(page, index)
    return page.wait_for(
        "(() => { const c = document.querySelectorAll('.jp-NotebookPanel .jp-Cell')"
        f"[{cells - 1}]; const o = c && c.querySelector('.jp-OutputArea');"
        " const t = o ? o.innerText : ''; return /RESULT|REFUSED/.test(t) ? t : ''; })()",
        90,
        f"the output of {notebook}'s cell {cells}",
    )


def test_a_cell_reserves_a_slice_and_runs_jax_with_the_token(
    lab: tuple[str, Path], browser: Page
) -> None:
    url, _ = lab
    output = _run_cells(browser, url, "with_token.ipynb", 1)
    # One v6e 2x2 host: 4 chips, so 4 JAX devices; sum(0..31) = 496.
    assert re.search(r"RESULT notebook-0 4 496\.0", output), output


def test_the_same_cell_without_the_token_is_refused(lab: tuple[str, Path], browser: Page) -> None:
    url, _ = lab
    output = _run_cells(browser, url, "without_token.ipynb", 2)
    assert "REFUSED" in output and "RESULT" not in output, output
