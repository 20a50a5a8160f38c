"""The name for a JSON object whose shape the code knows: a tool's schema, an
OpenAI-style request or reply, a server's ``/schema``, an engine's output."""

from __future__ import annotations

from typing import Any

# Its values are any JSON value (a str, a number, a list, an object, ...), read by
# key where the document's shape says what each holds; values typed ``object`` would
# need a check before every nested read. Where a JSON object is only passed on or
# checked value by value, the code says ``dict[str, object]`` instead.
JSONObject = dict[str, Any]
