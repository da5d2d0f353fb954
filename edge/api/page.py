"""GET / : the built-in chat page, one self-contained HTML file shipped as package data.

The page is a client of the public API like any other (it calls /v1/* with the
user's key), so serving it reveals nothing and needs no key. It is read once per
process: it never changes while the server runs. The CSP allows only this origin
and the page's own inline script and style, so the page cannot load or send
anything elsewhere even if model output were ever mis-rendered.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()

CSP = (
    "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline' 'self'; "
    "connect-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
HEADERS = {
    "Cache-Control": "no-cache",  # revalidate: an upgraded server serves its own page
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@cache
def chat_html() -> str:
    return files("edge.api").joinpath("static/chat.html").read_text(encoding="utf-8")


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def chat_page() -> HTMLResponse:
    return HTMLResponse(chat_html(), headers=HEADERS)
