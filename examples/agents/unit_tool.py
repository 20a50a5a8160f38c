"""A custom tool: a plain function with type hints and a docstring.

rlpost turns the hints and the docstring into the JSON schema the chat template
shows the model (``tools=``); the model calls it in the Hermes format,
``<tool_call>{"name": "convert", "arguments": {"value": 3, "unit": "km"}}</tool_call>``:

    python -m rlpost.main algo=grpo data=files data.train_files=units.jsonl \
        data.val_files=units_val.jsonl reward=custom reward.fn=my_reward.py:score \
        agent.tools=examples/agents/unit_tool.py:convert
"""

from __future__ import annotations

from typing import Literal

TO_METRES = {"km": 1000.0, "m": 1.0, "cm": 0.01, "mi": 1609.344, "ft": 0.3048}


def convert(value: float, unit: Literal["km", "m", "cm", "mi", "ft"]) -> str:
    """Convert a length to metres.

    Args:
        value: The length in `unit`.
        unit: One of km, m, cm, mi, ft.
    """
    return f"{value * TO_METRES[unit]:g} m"
