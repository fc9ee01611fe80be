"""The house as ARCHITECTURE.md describes it, checked on the source: the layer rules (imports one way, protocols
independent but for the layers they stand on, no cycle) as import-linter contracts in pyproject.toml, every
protocol one registered module offering the one API, files one idea (no file over 900 lines), and the three
folders installed under `dlcsniff` only."""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from dlcsniff.decoders.protocols import REGISTRY
from dlcsniff.decoders.protocols.base import ProtocolDecoder
from tests.conftest import REPO

PACKAGES = {"decoders": "dlcsniff.decoders", "analysis": "dlcsniff.analysis", "sniffer": "dlcsniff.sniffer",
            "dlcsniff": "dlcsniff"}
MAX_LINES = 900
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _installed_tree(root: Path) -> Path:
    """The package's Python files laid out as installed (pyproject's package-dir: decoders/ as dlcsniff/decoders/):
    import-linter reads a package from one folder, and the repository's editable install maps three into it."""
    package_dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in package_dirs.items():
        nested = {name.split(".")[1] for name in package_dirs if name.startswith(package + ".")}
        for path in (REPO / folder).rglob("*.py"):
            relative = path.relative_to(REPO / folder)
            if relative.parts[0] not in nested:
                target = root.joinpath(*package.split("."), relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
    shutil.copyfile(REPO / "pyproject.toml", root / "pyproject.toml")     # the contracts
    return root


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"import-linter is missing ({LINT_IMPORTS}): pip install -e '.[test]'")
    # in the staged tree: lint-imports imports the package from its working directory
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "1000"})


def _verdicts(report: str) -> dict[str, str]:
    """lint-imports' summary lines: contract name -> KEPT or BROKEN."""
    found = (re.match(r"(.+) (KEPT|BROKEN)\b", line) for line in report.split("Broken contracts")[0].splitlines())
    return {match[1]: match[2] for match in found if match}


def test_the_layer_contracts_hold(tmp_path):
    result = _lint_imports(_installed_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert _verdicts(result.stdout) == {contract["name"]: "KEPT" for contract in contracts}


@pytest.mark.parametrize("module, line, contract", [
    ("decoders/sansio.py", "from dlcsniff.analysis import load", "Layers"),
    ("sniffer/daemon.py", "import dlcsniff", "The package root"),
    ("decoders/protocols/zmtp/decoder.py", "from dlcsniff.decoders.protocols.gloo import wire",
     "Protocols stand on"),
    ("decoders/packet.py", "from dlcsniff.decoders import tcp", "No import cycle"),
])
def test_the_contracts_catch_a_wrong_import(module, line, contract, tmp_path):
    """Each contract breaks on one import against it, added to the staged copy (tcp.py stands on packet.py)."""
    tree = _installed_tree(tmp_path)
    path = tree / "dlcsniff" / module
    path.write_text(path.read_text() + f"\n{line}\n")
    result = _lint_imports(tree)
    assert result.returncode == 1, result.stdout
    assert [verdict for name, verdict in _verdicts(result.stdout).items() if name.startswith(contract)] == ["BROKEN"]


def test_the_installed_package_knows_only_dlcsniff():
    """No module imports the folders by their repository names (decoders.x, lab, tests): installed, only
    dlcsniff.* exists (a rule on names import-linter's graph cannot see: it has no such package)."""
    wrong = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                     else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.relative_to(REPO)}: {name}" for name in names
                      if name.split(".")[0] in ("decoders", "analysis", "sniffer", "lab", "tests")]
    assert wrong == []


def test_the_version_is_the_installed_one():
    from importlib.metadata import version

    import dlcsniff
    from dlcsniff.decoders.output_dir import dlcsniff_version
    assert dlcsniff.__version__ == version("dlcsniff") == dlcsniff_version()


def test_no_source_file_over_900_lines():
    long = {str(path.relative_to(REPO)): n for path in _modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_protocol_is_one_registered_module_with_the_one_api():
    protocol_packages = {p.parent.name for p in (REPO / "decoders" / "protocols").glob("*/__init__.py")}
    # the folder's own modules are the registry and the two APIs (a capture's decoder, a job step)
    assert {p.stem for p in (REPO / "decoders" / "protocols").glob("*.py")} == {"__init__", "base", "job_step"}
    registered = {entry.module.split(".")[0] for entry in REGISTRY}
    # the other packages of the folder are layers a registered protocol stands on (ZMTP under ps-lite, the
    # TCPStore rendezvous Gloo and NCCL read their ranks from, NCCL's job-wide collectives over its transports)
    helpers = protocol_packages - registered
    assert helpers <= {"zmtp", "tcpstore", "nccl"}, helpers
    api = [name for name, member in inspect.getmembers(ProtocolDecoder) if not name.startswith("_")
           and callable(member)]
    for entry in REGISTRY:
        cls = entry.decoder_class()
        assert cls.name == entry.name
        assert all(callable(getattr(cls, method, None)) for method in api), (entry.name, api)
        assert isinstance(cls(), ProtocolDecoder)


def test_the_daemon_and_help_do_not_load_the_protocol_decoders():
    """The registry names its decoders without importing them: the capture daemon reads it for its cut, and of
    the protocols' packages it loads libnccl's API tables only (its uprobes' function ids)."""
    code = ("import sys, dlcsniff.sniffer.ebpf, dlcsniff.decoders.protocols as p; "
            "print(sorted(m for m in sys.modules if m.startswith('dlcsniff.decoders.protocols.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['dlcsniff.decoders.protocols.nccl', 'dlcsniff.decoders.protocols.nccl.probes']"


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
