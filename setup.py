"""The layer folders (algos/, rollout/, trainers/) stand at the top of the
repository and install inside the ``rlpost`` namespace (``rlpost.algos`` ...),
so nothing but ``rlpost`` lands in a user's import space."""

from setuptools import find_packages, setup

LAYERS = ("algos", "rollout", "trainers")

packages = find_packages(include=["rlpost", "rlpost.*"])
package_dir = {"rlpost": "rlpost"}
for layer in LAYERS:
    package_dir[f"rlpost.{layer}"] = layer
    packages += [f"rlpost.{p}" for p in find_packages(include=[layer, f"{layer}.*"])]

setup(packages=packages, package_dir=package_dir)
