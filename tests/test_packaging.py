"""Only `fedmodel` is installed (issue 26): the repository's backends/ and topologies/ folders
are its subpackages fedmodel.backends and fedmodel.topologies (pyproject's package-dir), so
`pip install .` puts no top-level `backends` into site-packages to clash with other projects."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = {"fedmodel": "fedmodel", "backends": "fedmodel.backends",
           "topologies": "fedmodel.topologies"}


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_installs_inside_fedmodel():
    packages = set(_config()["packages"])
    found = {".".join((FOLDERS[init.relative_to(ROOT).parts[0]],)
                      + init.parent.relative_to(ROOT / init.relative_to(ROOT).parts[0]).parts)
             for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}
    assert packages == found
    assert {name.split(".")[0] for name in packages} == {"fedmodel"}
    assert _config()["package-dir"] == {"fedmodel.backends": "backends",
                                        "fedmodel.topologies": "topologies"}


def test_entry_points_name_installed_modules():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for group in project["entry-points"].values():
        for target in group.values():
            assert target.startswith("fedmodel."), target
    assert project["scripts"]["fedmodel"].startswith("fedmodel.")


@pytest.mark.integration
def test_the_wheel_holds_only_fedmodel(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                    "-q", str(ROOT), "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {"fedmodel", "fedmodel-0.1.0.dist-info"}
    assert "fedmodel/backends/dald/backend.py" in names
    assert "fedmodel/topologies/__init__.py" in names
