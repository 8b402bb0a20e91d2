"""An installed tpusim (a wheel, not this checkout) carries every module and every shipped config.

pyproject.toml lists the packages by hand because it maps ``tpusim.configs`` to the top-level ``configs/``
folder; these tests keep that list and the package-data globs in step with the files on disk.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest

from tpusim.config import CONFIG_DIR, config_dir

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str) -> Path:
    """The source folder of ``package`` under pyproject's package-dir mapping."""
    mapping = SETUPTOOLS.get("package-dir", {})
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in mapping:
            return ROOT / mapping[head] / Path(*parts[i:])
    return ROOT / Path(*parts)


def test_every_python_package_is_listed() -> None:
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tpusim").rglob("*.py")}
    listed = {p for p in SETUPTOOLS["packages"] if not p.startswith("tpusim.configs")}
    assert listed == on_disk


def test_every_shipped_config_file_is_package_data() -> None:
    data = SETUPTOOLS["package-data"]
    shipped = set()
    for package, globs in data.items():
        folder = _folder(package)
        assert folder.is_dir(), f"{package} maps to {folder}, which is not a folder"
        shipped |= {
            f
            for f in folder.rglob("*")
            if f.is_file() and any(fnmatch(f.relative_to(folder).as_posix(), g) for g in globs)
        }
    on_disk = {f for f in (ROOT / "configs").rglob("*") if f.is_file()}
    assert on_disk - shipped == set(), "configs/ files a wheel would leave out"


def test_config_dir_prefers_the_installed_copy(tmp_path: Path) -> None:
    """In a wheel, tpusim/configs holds the configs; in a checkout, configs/ beside the package does."""
    package = tmp_path / "tpusim"
    package.mkdir()
    assert config_dir(package) == tmp_path / "configs"
    (package / "configs").mkdir()
    (package / "configs" / "tpu_v5e.yaml").write_text("")
    assert config_dir(package) == package / "configs"
    assert (CONFIG_DIR / "tiling" / "tpu_default.yaml").is_file()
