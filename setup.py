"""The layer folders (algos/, rollout/, runtime/, trainers/) stand at the top of the
repository and install inside the ``rlpost`` namespace (``rlpost.algos`` ...),
so nothing but ``rlpost`` lands in a user's import space. So do the shipped
presets: ``configs/`` installs as ``rlpost/configs/``, where
``rlpost.config.compose.config_dir`` finds them; MANIFEST.in names its YAML
files as package data (pyproject.toml's ``package-data`` table would replace a
``package_data`` given here)."""

from pathlib import Path

from setuptools import find_packages, setup

LAYERS = ("algos", "rollout", "runtime", "trainers")

packages = find_packages(include=["rlpost", "rlpost.*"])
package_dir = {"rlpost": "rlpost"}
for layer in LAYERS:
    package_dir[f"rlpost.{layer}"] = layer
    packages += [f"rlpost.{p}" for p in find_packages(include=[layer, f"{layer}.*"])]
# Data-only packages, YAML and no __init__.py: configs/ and its group folders
# (listed too, or setuptools warns that it sees packages it was not given).
package_dir["rlpost.configs"] = "configs"
packages += ["rlpost.configs"] + [
    f"rlpost.configs.{d.name}" for d in sorted(Path("configs").iterdir()) if d.is_dir()
]

setup(packages=packages, package_dir=package_dir)
