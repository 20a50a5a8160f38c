"""The built-in models' positions (``max_position_embeddings``), apart from the
modules that build them: the run plan checks ``rollout.max_model_len`` against
these before Ray starts, without importing transformers."""

from __future__ import annotations

TEXT_POSITIONS = 256  # the tiny Qwen2 presets (rlpost.models.tiny)
VL_TEXT_POSITIONS = 1024  # the vision-language presets' language model (rlpost.models.vl)
