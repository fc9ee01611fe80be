"""The house as ARCHITECTURE.md describes it, checked on the source: imports flow one way with no cycle, every
protocol is one registered module offering the one API, files stay one idea (no file over 900 lines), and the
three folders install under `dlcsniff` only."""
from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dlcsniff.decoders.protocols import REGISTRY
from dlcsniff.decoders.protocols.base import ProtocolDecoder
from tests.conftest import REPO

PACKAGES = {"decoders": "dlcsniff.decoders", "analysis": "dlcsniff.analysis", "sniffer": "dlcsniff.sniffer",
            "dlcsniff": "dlcsniff"}
# Who may import whom: the capture side and the analysis side both stand on the decoders; the CLI on all.
MAY_IMPORT = {"dlcsniff.decoders": {"dlcsniff.decoders"},
              "dlcsniff.sniffer": {"dlcsniff.sniffer", "dlcsniff.decoders"},
              "dlcsniff.analysis": {"dlcsniff.analysis", "dlcsniff.decoders"},
              "dlcsniff": {"dlcsniff", "dlcsniff.decoders", "dlcsniff.analysis", "dlcsniff.sniffer"}}
MAX_LINES = 900


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _layer(module: str) -> str:
    return next(p for p in ("dlcsniff.decoders", "dlcsniff.analysis", "dlcsniff.sniffer", "dlcsniff")
                if module == p or module.startswith(p + "."))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                top = target.split(".")[0]
                assert top not in ("decoders", "analysis", "sniffer", "lab", "tests"), \
                    f"{path}: imports {target}: the installed package knows only dlcsniff.*"
                if target in modules and target != name:
                    deps.add(target)
        edges[name] = deps
    return edges


def test_imports_flow_one_way(graph):
    # the package root is the Python API's door (dlcsniff.decode, dlcsniff.load): it stands on every layer and
    # no layer imports it
    wrong = [(module, dep) for module, deps in graph.items() for dep in deps
             if _layer(dep) not in MAY_IMPORT[_layer(module)]
             or (dep == "dlcsniff" and not module.startswith("dlcsniff.cli"))]
    assert wrong == []


def test_the_version_is_the_installed_one():
    from importlib.metadata import version

    import dlcsniff
    from dlcsniff.decoders.output_dir import dlcsniff_version
    assert dlcsniff.__version__ == version("dlcsniff") == dlcsniff_version()


def test_no_import_cycle(graph):
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_no_source_file_over_900_lines():
    long = {str(path.relative_to(REPO)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_protocol_is_one_registered_module_with_the_one_api():
    protocol_modules = {p.stem for p in (REPO / "decoders" / "protocols").glob("*.py")} - {"__init__", "base"}
    registered = {entry.module for entry in REGISTRY}
    # the other modules of the folder are layers a registered protocol decodes on (ZMTP under ps-lite, its
    # meta's descriptor, the TCPStore rendezvous Gloo ranks come from, Gloo's transport under its capture decoder)
    helpers = protocol_modules - registered
    assert helpers <= {"zmtp", "pslite_meta", "tcpstore", "gloo_wire"}, helpers
    api = [name for name, member in inspect.getmembers(ProtocolDecoder) if not name.startswith("_")
           and callable(member)]
    for entry in REGISTRY:
        cls = entry.decoder_class()
        assert cls.name == entry.name
        assert all(callable(getattr(cls, method, None)) for method in api), (entry.name, api)
        assert isinstance(cls(), ProtocolDecoder)


def test_the_daemon_and_help_do_not_load_the_protocol_decoders():
    """The registry names its decoders without importing them: the capture daemon reads it for its cut."""
    code = ("import sys, dlcsniff.sniffer.ebpf, dlcsniff.decoders.protocols as p; "
            "print(sorted(m for m in sys.modules if m.startswith('dlcsniff.decoders.protocols.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_wheel_installs_dlcsniff_only(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True)
    (wheel,) = tmp_path.glob("dlcsniff-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"dlcsniff"}
    packaged = {name.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
                for name in names if name.endswith(".py")}
    assert packaged == set(_modules()), set(_modules()) ^ packaged
    assert "dlcsniff/sniffer/probes/zmtp_snap.c" in names
    parts = sorted(p.name for p in (REPO / "decoders" / "wireshark" / "parts").glob("*.lua"))
    assert parts and {f"dlcsniff/decoders/wireshark/parts/{part}" for part in parts} <= set(names)


def test_every_module_imports():
    for module in sorted(_modules()):
        if module != "dlcsniff.__main__":
            importlib.import_module(module)
