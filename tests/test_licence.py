"""Every distribution declares its licence, Apache-2.0: the server's and the client's wheels say so
in their metadata (the SPDX expression, PEP 639) and carry the LICENSE file, and the npm package's
``package.json`` says so and packs the file (``tests/client_ts`` checks the packed tarball)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIES = [ROOT / "clients" / "python" / "LICENSE", ROOT / "clients" / "typescript" / "LICENSE"]


def test_the_licence_is_apache_2_and_each_distribution_holds_the_same_text():
    text = (ROOT / "LICENSE").read_text("utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    for copy in COPIES:  # a distribution packs only files under its own folder
        assert copy.read_text("utf-8") == text, f"{copy.relative_to(ROOT)} differs from LICENSE"


def test_the_npm_package_declares_apache_2_and_packs_the_licence():
    package = json.loads((ROOT / "clients" / "typescript" / "package.json").read_text("utf-8"))
    assert package["license"] == "Apache-2.0"
    assert "LICENSE" in package["files"]
    lock = json.loads((ROOT / "clients" / "typescript" / "package-lock.json").read_text("utf-8"))
    assert lock["packages"][""]["license"] == "Apache-2.0"


@pytest.mark.slow
@pytest.mark.parametrize("folder", [".", "clients/python"], ids=["saga-admin", "saga-admin-client"])
def test_the_built_wheel_declares_apache_2_and_carries_the_licence(folder: str, tmp_path: Path):
    # Built from a copy of the tracked files: setuptools writes build/ beside the sources it
    # builds, and one left in the checkout makes mypy see every module twice.
    source = tmp_path / "source"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", folder], cwd=ROOT, capture_output=True, check=True
    )
    for name in filter(None, tracked.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--wheel-dir",
            str(wheels),
            str(source / folder),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert not (ROOT / folder / "build").exists()
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode("utf-8"))
        (licence_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licence_name).decode("utf-8") == (ROOT / "LICENSE").read_text("utf-8")
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
