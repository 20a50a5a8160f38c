"""The run config: the typed schema of every Hydra group (``groups``), the
validator that reports every bad key at once (``schema``), the checks across
groups (``checks``) and Hydra composition (``compose``).

May import: the standard library, Hydra/OmegaConf, ``rlpost.algos`` (its configs
are groups of the run config, and its registries name what they accept), and the
engines' settings that are groups too (``rlpost.trainers.lora_settings``,
``rlpost.trainers.megatron.config``). Nothing else in ``rlpost`` imports below it.
"""

from rlpost.config.compose import compose, compose_dict, config_dir, from_dict, to_dict
from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError

__all__ = ["Config", "ConfigError", "compose", "compose_dict", "config_dir", "from_dict", "to_dict"]
