"""Built-in verifiers, each a named reward (``reward.fn=math``, ``gsm8k``,
``gsm8k_flexible``, ``think_format``, ``code``) returning one score under its
own name, e.g. ``{"math": 1.0}``, so combined rewards report ``reward/math``."""

from rlpost.rewards.verifiers.code import code_reward
from rlpost.rewards.verifiers.gsm8k import gsm8k_flexible_reward, gsm8k_reward
from rlpost.rewards.verifiers.math_answer import math_reward
from rlpost.rewards.verifiers.think_format import think_format_reward

__all__ = [
    "code_reward",
    "gsm8k_flexible_reward",
    "gsm8k_reward",
    "math_reward",
    "think_format_reward",
]
