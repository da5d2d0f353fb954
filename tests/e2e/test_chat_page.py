"""The chat page at / in a real browser against a live `edge serve` with SmolLM2.

Debian's Chromium (/usr/bin/chromium, installed by scripts/test.sh) driven headless
by Playwright; Playwright's own browser downloads are never used. Without
Chromium the tests skip on a developer machine and fail under CI.
Screenshots go to pytest's tmp_path and, when set, to $EDGE_SCREENSHOT_DIR.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import LiveServer, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers give /dev/shm 64 MiB; Chromium crashes on big pages
]
KEY = "page-test-key"
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 375, "height": 812}
ASSISTANT = "#messages li.msg.assistant"
POEM = "Write a short poem about the sea."
GROWTH_JS = """() => {
  window.__growth = [];
  const log = document.getElementById('messages');
  new MutationObserver(() => {
    const b = log.querySelectorAll('li.msg.assistant .bubble');
    if (b.length) window.__growth.push(b[b.length - 1].textContent.length);
  }).observe(log, {subtree: true, childList: true, characterData: true});
}"""


def _chromium_or_skip() -> None:
    if CHROMIUM.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing under CI: scripts/test.sh installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium, or run scripts/test.sh)")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    args = ("--slots", "2", "--ctx", "4096", "--threads", "1")
    s = launch(tmp_path_factory.mktemp("chat"), smollm2_path, *args)
    yield s
    assert s.stop() == 0


def _shot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path))
    extra = os.environ.get("EDGE_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(extra) / name))
    return path


def _errors(page: Any) -> list[str]:
    """Uncaught exceptions and CSP violations (a blocked inline script shows up here)."""
    found: list[str] = []
    page.on("pageerror", lambda exc: found.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: found.append(f"console: {msg.text}")
        if msg.type == "error" and "Content Security Policy" in msg.text
        else None,
    )
    return found


# length of the last assistant bubble's text, -1 when there is none; Playwright gets functions only
# (a bare expression string would be eval'd, which the page's CSP rightly forbids)
LAST_LEN_EXPR = f"""(() => {{
  const b = document.querySelectorAll('{ASSISTANT} .bubble');
  return b.length ? b[b.length - 1].textContent.length : -1;
}})()"""


def _bubble_len(page: Any) -> int:
    return int(page.evaluate(f"() => {LAST_LEN_EXPR}"))


def _ask(page: Any, text: str) -> None:
    page.fill("#input", text)
    page.focus("#input")
    page.keyboard.press("Enter")


def _set_max_tokens(page: Any, n: int) -> None:
    if page.is_hidden("#settings"):
        page.click("#settingsBtn")
    page.fill("#maxTokens", str(n))
    page.press("#maxTokens", "Tab")  # commits the change event
    page.click("#settingsBtn")
    assert page.is_hidden("#settings")


def _stop_mid_stream(page: Any, server: LiveServer, press: Any, shot: Path | None = None) -> None:
    """A long answer, stopped once it is visibly streaming: the partial text stays and stops growing."""
    _set_max_tokens(page, 3000)
    n_before = page.locator(ASSISTANT).count()
    _ask(page, "Write a very long story about a robot who learns to paint. Use at least 1500 words.")
    page.wait_for_function(
        f"() => document.querySelectorAll('{ASSISTANT}').length === {n_before + 1} && {LAST_LEN_EXPR} >= 40"
    )
    assert page.is_visible("#stop") and page.is_hidden("#send")
    if shot is not None:
        _shot(page, shot.parent, shot.name)
    press()
    page.wait_for_selector("#send", state="visible", timeout=5000)
    assert page.is_hidden("#stop")
    last = page.locator(ASSISTANT).last
    assert "Stopped" in last.locator(".meta").inner_text()
    stopped_len = _bubble_len(page)
    assert stopped_len >= 40
    time.sleep(1.5)  # a live stream would add several tokens in this time
    assert _bubble_len(page) == stopped_len
    deadline = time.monotonic() + 10
    while httpx.get(server.url + "/v1/status").json()["server"]["in_flight"] != 0:
        assert time.monotonic() < deadline, "the server kept generating after Stop"
        time.sleep(0.1)


def test_chat_page_streams_stops_persists_and_fits_a_phone(
    browser: Any, server: LiveServer, tmp_path: Path
) -> None:
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    errors = _errors(page)
    page.goto(server.url + "/")
    assert page.title().startswith("edge")

    page.wait_for_selector(f"#model option[value='{model}']", state="attached")
    page.select_option("#model", model)
    page.wait_for_function("() => document.querySelector('#st-server .v').textContent === 'ready'")
    page.focus("#input")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "send"  # keyboard reachable

    # 1. streamed answer, sent with the keyboard; Shift+Enter is a newline, not a send
    _set_max_tokens(page, 64)
    page.fill("#input", POEM)
    page.focus("#input")
    page.keyboard.press("Shift+Enter")
    assert page.locator("#messages li").count() == 0
    assert page.input_value("#input").endswith("\n")
    page.evaluate(GROWTH_JS)
    page.keyboard.press("Enter")
    page.wait_for_selector(f"{ASSISTANT}:not(.streaming)", state="attached", timeout=60_000)
    growth = page.evaluate("() => window.__growth")
    lengths = sorted(set(growth))
    assert len(lengths) >= 3 and growth[-1] == max(growth) > 0, growth  # grew step by step
    first = page.locator(ASSISTANT).last
    assert first.locator(".bubble").inner_text().strip()
    assert "tok/s" in first.locator(".meta").inner_text()
    assert page.locator("#messages li.msg.user .bubble").first.inner_text() == POEM
    assert page.locator("#messages li.msg.error").count() == 0
    page.wait_for_function("() => document.querySelector('#st-speed .v').textContent.endsWith('tok/s')")
    assert page.is_visible("#send") and page.is_hidden("#stop")

    # 2. Stop button, then Escape, each in the middle of a long answer
    _stop_mid_stream(page, server, lambda: page.click("#stop"), shot=tmp_path / "chat-streaming.png")
    _stop_mid_stream(page, server, lambda: page.keyboard.press("Escape"))

    # 3. the conversation survives a reload, stopped answers included
    before = page.locator("#messages li .bubble").all_inner_texts()
    assert len(before) == 6
    page.reload()
    page.wait_for_selector("#messages li", state="attached")
    assert page.locator("#messages li .bubble").all_inner_texts() == before
    assert page.input_value("#maxTokens") == "3000"
    page.wait_for_function("() => document.querySelector('#st-server .v').textContent === 'ready'")
    # no scheduler status from this server's telemetry is ever dressed up as fine
    for pill in ("#st-temp", "#st-thermal", "#st-memory"):
        level = page.get_attribute(pill, "data-level")
        value = page.inner_text(f"{pill} .v")
        assert (level == "unknown") == (value in ("unknown", "unavailable")), (pill, level, value)
    _shot(page, tmp_path, "chat-desktop.png")
    page.emulate_media(color_scheme="dark")
    _shot(page, tmp_path, "chat-desktop-dark.png")
    page.emulate_media(color_scheme="light")

    # 4. a phone: no horizontal scrolling, controls stacked, composer on screen
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(100)
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    assert page.evaluate("() => document.body.scrollWidth <= window.innerWidth")
    for sel in ("#model", "#settingsBtn", "#newChat", "#input", "#send"):
        box = page.locator(sel).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, sel
    assert page.locator("#model").bounding_box()["width"] > PHONE["width"] / 2  # stacked, full width
    _shot(page, tmp_path, "chat-phone.png")
    page.click("#settingsBtn")
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    _shot(page, tmp_path, "chat-phone-settings.png")
    page.click("#settingsBtn")

    # 5. New chat clears the conversation, also across a reload
    page.click("#newChat")
    assert page.locator("#messages li").count() == 0
    page.reload()
    page.wait_for_selector("#empty", state="visible")
    assert page.locator("#messages li").count() == 0
    assert errors == []
    context.close()


def test_chat_page_asks_for_the_key_and_then_uses_it(
    browser: Any, smollm2_path: Path, start_server: Any, tmp_path: Path
) -> None:
    s = start_server(smollm2_path, "--slots", "1", "--ctx", "1024", "--threads", "1",
                     env={"EDGE_API_KEY": KEY})
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    errors = _errors(page)
    page.goto(s.url + "/")
    # the page loads without the key; its API calls do not, and it says so
    page.wait_for_selector("#settings", state="visible")
    page.wait_for_function("() => document.activeElement.id === 'apiKey'")
    assert "API key" in page.inner_text("#model")
    assert page.inner_text("#st-server .v") == "API key needed"
    page.fill("#apiKey", KEY)
    page.press("#apiKey", "Tab")
    page.wait_for_selector("#model option[value]:not([value=''])", state="attached")
    page.wait_for_function("() => document.querySelector('#st-server .v').textContent === 'ready'")
    page.fill("#maxTokens", "8")
    page.press("#maxTokens", "Tab")
    _ask(page, "Say hello.")
    page.wait_for_selector(f"{ASSISTANT}:not(.streaming)", state="attached", timeout=60_000)
    assert page.locator("#messages li.msg.error").count() == 0
    assert page.locator(ASSISTANT).last.locator(".bubble").inner_text().strip()

    # a wrong key: the server's error is shown in the conversation, and the page asks again
    page.fill("#apiKey", "wrong")
    page.press("#apiKey", "Tab")
    _ask(page, "Say hello again.")
    error = page.locator("#messages li.msg.error").last
    error.wait_for()
    assert "401" in error.inner_text() and "missing or invalid API key" in error.inner_text()
    page.wait_for_function("() => document.activeElement.id === 'apiKey'")
    _shot(page, tmp_path, "chat-key-error.png")
    assert errors == []
    context.close()


def _sse(*events: object) -> str:
    return "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)


def _chunk(text: str) -> dict[str, object]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]}


def test_chat_page_shows_server_errors_and_never_renders_html(
    browser: Any, server: LiveServer, tmp_path: Path
) -> None:
    """Replies the live server cannot be made to give on cue are played by the browser's router."""
    context = browser.new_context(viewport=DESKTOP)
    page = context.new_page()
    errors = _errors(page)
    replies: list[dict[str, Any]] = [
        {"status": 503, "headers": {"Retry-After": "7"},
         "json": {"error": {"message": "device too hot, paused", "type": "server_error"}}},
        {"status": 200, "content_type": "text/event-stream",
         "body": _sse(_chunk("<img src=x onerror=\"window.__xss=1\">"), _chunk(" <b>bold</b> and"),
                      {"error": {"message": "backend failed mid-answer"}})},
    ]
    sent: list[Any] = []

    def reply(route: Any) -> None:
        sent.append(route.request.post_data_json)
        route.fulfill(**replies.pop(0))

    page.route("**/v1/chat/completions", reply)
    page.goto(server.url + "/")
    page.wait_for_selector("#model option[value]:not([value=''])", state="attached")
    page.click("#settingsBtn")
    page.fill("#system", "Be brief.")
    page.click("#settingsBtn")

    _ask(page, "First question")
    busy = page.locator("#messages li.msg.error").last
    busy.wait_for()
    text = busy.inner_text()
    assert "503" in text and "device too hot, paused" in text and "7 s" in text, text
    assert page.locator(ASSISTANT).count() == 0  # no empty answer left behind

    _ask(page, "Second question")
    page.wait_for_function("() => document.querySelectorAll('#messages li.msg.error').length === 2")
    answer = page.locator(ASSISTANT).last.locator(".bubble")
    assert answer.inner_text() == '<img src=x onerror="window.__xss=1"> <b>bold</b> and'  # kept, as text
    assert page.locator("#messages img, #messages b").count() == 0
    assert page.evaluate("() => window.__xss") is None
    assert "backend failed mid-answer" in page.locator("#messages li.msg.error").last.inner_text()
    assert page.is_visible("#send") and page.is_hidden("#stop")
    # the unanswered first question is left out: roles alternate, the system prompt leads
    assert [m["role"] for m in sent[1]["messages"]] == ["system", "user"]
    assert sent[1]["messages"][0]["content"] == "Be brief."
    assert sent[1]["stream"] is True
    _shot(page, tmp_path, "chat-errors.png")
    page.reload()
    page.wait_for_selector("#messages li.msg.error", state="attached")
    assert page.input_value("#system") == "Be brief."
    assert page.locator("#messages li").count() == 5
    assert errors == []
    context.close()
