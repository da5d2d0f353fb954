"""Early weights (runtime/llama/early.py): a start with the command line of a start that loaded
models begins those loads at once, hands them to the loads that ask for the same file and
placement, and never hands over anything else."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from edge.runtime.llama.early import EarlyWeights, start_key

ARGV = ["serve", "smollm2", "--port", "8080"]
ENV = {"EDGE_SLOTS": "2", "HOME": "/home/me"}


class _Model:
    def __init__(self, path: str, n_gpu_layers: int, thread: str) -> None:
        self.path, self.n_gpu_layers, self.thread = path, n_gpu_layers, thread
        self.closed = False
        self.same = True

    def same_file(self) -> bool:
        return self.same

    def close(self) -> None:
        self.closed = True


class _Loader:
    """Loads fake models, failing the paths in `fail` (once each), holding those in `hold` until
    their event is set."""

    def __init__(self, fail: set[str] | None = None, hold: dict[str, threading.Event] | None = None) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.fail = set(fail or ())
        self.hold = hold or {}
        self.made: list[_Model] = []

    def __call__(self, path: str, n_gpu_layers: int) -> _Model:
        name = threading.current_thread().name
        self.calls.append((path, n_gpu_layers, name))
        if path in self.hold:
            assert self.hold[path].wait(10)
        if path in self.fail:
            self.fail.discard(path)
            raise OSError("cannot read")
        m = _Model(path, n_gpu_layers, name)
        self.made.append(m)
        return m


def _early(root: Path, loader: _Loader, quiet: bool = True) -> EarlyWeights:
    return EarlyWeights(root, loader, quiet_here=lambda: quiet)  # type: ignore[arg-type]


def _model(tmp_path: Path, name: str = "m.gguf") -> str:
    p = tmp_path / name
    p.write_bytes(b"GGUF" + b"\0" * 64)
    return str(p)


def _first_start(root: Path, paths: list[str], n_gpu_layers: int = 0, argv: list[str] = ARGV) -> None:
    loader = _Loader()
    early = _early(root, loader)
    assert early.begin(argv, "/srv", ENV) == 0  # nothing recorded yet
    for p in paths:
        early.open(p, n_gpu_layers)
    early.finish()
    assert [c[2] for c in loader.calls] == [threading.current_thread().name] * len(paths)


def test_a_start_records_its_loads_and_the_next_one_takes_them_early(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path])
    record = json.loads((root / f"{start_key(ARGV, '/srv', ENV)}.json").read_text())
    assert [m["path"] for m in record["models"]] == [path]

    loader = _Loader()
    early = _early(root, loader)
    assert early.begin(ARGV, "/srv", ENV) == 1
    got = early.open(path, 0)
    assert got.thread == "edge-early-load" and early.handed_over == 1  # loaded by the early thread
    assert loader.calls == [(path, 0, "edge-early-load")]  # and only there
    early.finish()
    assert not got.closed  # it is the server's now


@pytest.mark.parametrize("argv, cwd, env", [
    (["serve", "qwen", "--port", "8080"], "/srv", ENV),  # another model named
    (ARGV, "/elsewhere", ENV),  # another directory: relative paths and configs/ differ
    (ARGV, "/srv", {**ENV, "EDGE_SLOTS": "4"}),  # other settings
])
def test_another_command_line_directory_or_edge_setting_starts_nothing(
        tmp_path: Path, argv: list[str], cwd: str, env: dict[str, str]) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path])
    loader = _Loader()
    assert _early(root, loader).begin(argv, cwd, env) == 0
    assert loader.calls == []


def test_an_unrelated_environment_variable_keeps_the_key() -> None:
    assert start_key(ARGV, "/srv", ENV) == start_key(ARGV, "/srv", {**ENV, "HOME": "/root", "TERM": "x"})


@pytest.mark.parametrize("flag", ["-v", "--verbose", "--lazy", "--help"])
def test_verbose_lazy_and_help_starts_load_nothing_early_and_record_nothing(tmp_path: Path,
                                                                             flag: str) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path], argv=[*ARGV, flag])
    assert not root.exists()


def test_a_replaced_model_file_is_not_loaded_early(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path])
    Path(path).write_bytes(b"GGUF" + b"\1" * 80)  # another file at the same path
    loader = _Loader()
    early = _early(root, loader)
    assert early.begin(ARGV, "/srv", ENV) == 0
    early.open(path, 0)
    early.finish()  # and the record now names the new file
    assert _early(root, _Loader()).begin(ARGV, "/srv", ENV) == 1


def test_a_build_whose_loads_are_not_quiet_loads_nothing_early(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path])
    loader = _Loader()
    assert _early(root, loader, quiet=False).begin(ARGV, "/srv", ENV) == 0
    assert loader.calls == []


def test_an_early_load_nobody_asks_for_is_closed_and_the_record_follows_this_start(tmp_path: Path) -> None:
    root, a, b = tmp_path / "starts", _model(tmp_path, "a.gguf"), _model(tmp_path, "b.gguf")
    _first_start(root, [a])
    loader = _Loader()
    early = _early(root, loader)
    assert early.begin(ARGV, "/srv", ENV) == 1
    got = early.open(b, 0)  # the store now resolves the name to another file
    assert got.path == b and got.thread == threading.current_thread().name and early.handed_over == 0
    early.finish()
    stale = next(m for m in loader.made if m.path == a)
    assert stale.closed and not got.closed
    record = json.loads((root / f"{start_key(ARGV, '/srv', ENV)}.json").read_text())
    assert [m["path"] for m in record["models"]] == [b]


def test_another_placement_is_loaded_anew(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path], n_gpu_layers=0)
    loader = _Loader()
    early = _early(root, loader)
    early.begin(ARGV, "/srv", ENV)
    got = early.open(path, 99)  # the plan placed layers elsewhere this time
    assert got.n_gpu_layers == 99 and early.handed_over == 0
    early.finish()
    assert all(m.closed for m in loader.made if m.n_gpu_layers == 0)


def test_a_failed_early_load_is_loaded_again_where_its_error_is_reported(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path])
    loader = _Loader(fail={path})
    early = _early(root, loader)
    early.begin(ARGV, "/srv", ENV)
    got = early.open(path, 0)
    assert [c[2] for c in loader.calls] == ["edge-early-load", threading.current_thread().name]
    assert got.thread == threading.current_thread().name and early.handed_over == 0


def test_a_file_changed_while_it_loaded_early_is_closed_and_loaded_again(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    _first_start(root, [path])
    loader = _Loader()
    early = _early(root, loader)
    early.begin(ARGV, "/srv", ENV)
    early._join()
    loader.made[0].same = False  # its file identity no longer matches the path
    got = early.open(path, 0)
    assert loader.made[0].closed and got is loader.made[1] and early.handed_over == 0


def test_loads_after_the_start_are_not_recorded(tmp_path: Path) -> None:
    root, a, b = tmp_path / "starts", _model(tmp_path, "a.gguf"), _model(tmp_path, "b.gguf")
    early = _early(root, _Loader())
    early.begin(ARGV, "/srv", ENV)
    early.open(a, 0)
    early.finish()
    early.open(b, 0)  # a model asked for later, by a request
    early.finish()
    record = json.loads((root / f"{start_key(ARGV, '/srv', ENV)}.json").read_text())
    assert [m["path"] for m in record["models"]] == [a]


def test_an_unreadable_record_is_replaced(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    root.mkdir()
    (root / f"{start_key(ARGV, '/srv', ENV)}.json").write_text("{not json")
    _first_start(root, [path])
    assert _early(root, _Loader()).begin(ARGV, "/srv", ENV) == 1
    assert not [p for p in os.listdir(root) if p.endswith(".tmp")]


def test_the_first_model_is_handed_over_while_the_next_one_still_loads(tmp_path: Path) -> None:
    root, a, b = tmp_path / "starts", _model(tmp_path, "a.gguf"), _model(tmp_path, "b.gguf")
    _first_start(root, [a, b])  # e.g. a chat model and --embedding-model
    release_b = threading.Event()
    loader = _Loader(hold={b: release_b})
    early = _early(root, loader)
    assert early.begin(ARGV, "/srv", ENV) == 2
    got: list[_Model] = []
    took_a = threading.Thread(target=lambda: got.append(early.open(a, 0)))
    took_a.start()
    took_a.join(10)
    assert not took_a.is_alive() and got[0].path == a  # while b is still loading
    assert got[0].thread == "edge-early-load"
    release_b.set()
    assert early.open(b, 0).thread == "edge-early-load" and early.handed_over == 2
    early.finish()


def test_a_command_line_never_seen_loads_the_model_files_it_names_early(tmp_path: Path) -> None:
    """No record: the `.gguf` files on the command line that exist, resolved as the host resolves
    a path (relative to the directory, links followed), each once; a file named but not asked
    for is closed at the end."""
    root, a, b = tmp_path / "starts", _model(tmp_path, "a.gguf"), _model(tmp_path, "b.gguf")
    os.symlink(a, tmp_path / "link.GGUF")
    argv = ["serve", "a.gguf", "link.GGUF", "missing.gguf", "--draft-model=b.gguf", "--port", "1"]
    loader, checked = _Loader(), _Checker()
    early = _early(root, loader)
    assert early.begin(argv, str(tmp_path), ENV, check=checked) == 2
    got = early.open(a, 0)
    assert got.thread == "edge-early-load" and early.handed_over == 1
    early.finish()
    assert [(c[0], c[2]) for c in loader.calls] == [(a, "edge-early-load"), (b, "edge-early-load")]
    assert checked.calls == [(a, "edge-early-load"), (b, "edge-early-load")]  # each before its load
    assert [m.closed for m in loader.made] == [False, True]


class _Checker:
    """edge's GGUF checks as cli.py passes them: records (path, thread), refuses `bad`."""

    def __init__(self, bad: str | None = None) -> None:
        self.bad = bad
        self.calls: list[tuple[str, str]] = []

    def __call__(self, path: str) -> None:
        self.calls.append((path, threading.current_thread().name))
        if path == self.bad:
            raise ValueError("invalid GGUF: repeated token")


def test_a_file_no_start_loaded_that_fails_the_checks_never_reaches_llama_cpp_early(tmp_path: Path) -> None:
    """llama.cpp aborts the process on some bad files: the host's checks refuse them with a reason,
    and the early thread must not load one before they ran."""
    root, bad = tmp_path / "starts", _model(tmp_path, "bad.gguf")
    loader = _Loader()
    early = _early(root, loader)
    assert early.begin(["serve", bad], "/srv", ENV, check=_Checker(bad=bad)) == 1
    early.finish()  # (the host refused it, so nobody opened it)
    assert loader.calls == []


def test_without_checks_only_files_a_start_loaded_load_early(tmp_path: Path) -> None:
    root, path = tmp_path / "starts", _model(tmp_path)
    loader = _Loader()
    assert _early(root, loader).begin(["serve", path], "/srv", ENV) == 0
    assert loader.calls == []


def test_at_most_a_few_files_named_load_early(tmp_path: Path) -> None:
    from edge.runtime.llama.early import MAX_GUESSES

    paths = [_model(tmp_path, f"m{i}.gguf") for i in range(MAX_GUESSES + 2)]
    loader = _Loader()
    early = _early(tmp_path / "starts", loader)
    assert early.begin(["serve", *paths], str(tmp_path), ENV, check=_Checker()) == MAX_GUESSES
    early.finish()
    assert [c[0] for c in loader.calls] == paths[:MAX_GUESSES]


def test_files_named_on_a_build_whose_loads_are_not_quiet_load_nothing_early(tmp_path: Path) -> None:
    path, loader = _model(tmp_path), _Loader()
    assert _early(tmp_path / "starts", loader, quiet=False).begin(["serve", path], "/srv", ENV,
                                                                  check=_Checker()) == 0
    assert loader.calls == []


def test_the_command_line_parser_loads_no_native_library() -> None:
    """`edge --help` builds every command's parser: `serve` reaches the early weights (and
    llama.cpp) only when it runs."""
    import subprocess
    import sys

    code = "import sys, edge.cli; edge.cli.build_parser(None); print('llama_cpp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_serve_hands_the_early_thread_edges_gguf_checks(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main begins the early loads with the checks the host runs before a load: a file whose
    vocabulary repeats a token (llama.cpp GGML_ASSERTs on it) is refused with the reason."""
    from edge import cli
    from edge.errors import InvalidGGUF
    from edge.gcpause import START
    from edge.runtime.llama.early import EARLY
    from tests.ggufgen import ARRAY, STRING, RawGGUF

    began: list[object] = []
    monkeypatch.setattr(EARLY, "begin", lambda words, check=None: began.append(check) or 0)
    monkeypatch.setattr(START, "pause", lambda: None)  # this test process keeps its collector
    monkeypatch.setattr(sys, "argv", ["edge", "serve", "--help"])
    with pytest.raises(SystemExit):
        cli.main()
    (check,) = began
    g = RawGGUF.minimal()
    g.kvs[-1] = ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "a"]))
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(InvalidGGUF, match="repeats an earlier entry"):
        check(str(g.write(tmp_path / "dup.gguf")))  # type: ignore[operator]
