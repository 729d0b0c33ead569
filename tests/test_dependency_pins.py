"""constraints.txt pins what the tests ran with, and pyproject.toml's floors keep out versions
with known advisories: `make test`, `make run` and the image install with the pins."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
#: The newest version of each package with an advisory its floor must keep out.
ADVISORIES = {
    "tornado": "6.5.9",  # 6.5.10 carries the last security fixes known (GHSA-mpf4-983q-p7j4 was 6.5.8's)
    "sqlparse": "0.5.3",  # GHSA-27jp-wm6q-gp25, fixed in 0.5.4
}


def runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["postgres"], *extras["run"]]]


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            assert pinned and re.fullmatch(r"[\w.+!-]+", pinned), f"constraints.txt: {line!r} is not name==version"
            found[canonicalize_name(name)] = pinned
    return found


def test_every_runtime_dependency_is_pinned_within_its_floor_and_installed_so() -> None:
    pinned = pins()
    for requirement in runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is outside {requirement}"
        # `make test` installs with the pins: what runs here is what was pinned.
        assert version(requirement.name) == pinned[name], f"{name}: installed {version(requirement.name)}"
    assert pinned["psycopg-binary"] == pinned["psycopg"]  # the extra's own package, pinned with it


def test_floors_keep_out_the_versions_with_known_advisories() -> None:
    """They were `tornado>=6.4` and `sqlparse>=0.5`, both admitting versions with advisories."""
    floors = {canonicalize_name(r.name): r.specifier for r in runtime_requirements()}
    for name, vulnerable in ADVISORIES.items():
        assert not floors[name].contains(vulnerable), f"{name} {floors[name]} admits {vulnerable}"


def test_make_and_the_image_install_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): .*\bconstraints\.txt\b", makefile, re.M), "a new pin would not reinstall"
    installs = re.findall(r"pip install [^\n]*'\.\[", makefile)
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    # `make run` and `make test` both depend on the stamp, so both run in the pinned environment.
    assert re.search(r"^run: \$\(STAMP\)", makefile, re.M) and re.search(r"^test: \$\(STAMP\)", makefile, re.M)
    docker = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^COPY [^\n]*\bconstraints\.txt\b", docker, re.M)
    assert "pip install -c constraints.txt '.[postgres]'" in docker
