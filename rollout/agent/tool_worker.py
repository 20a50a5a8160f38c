"""The tool worker process: ``python -m rlpost.rollout.agent.tool_worker``.

``ToolWorkerPool`` (``tool_pool``) starts these; each reads one JSON request a
line (``{"spec", "arguments"}``), runs the tool and answers
``{"status", "text"}`` on a private channel, so what a tool prints never
corrupts a reply.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from rlpost.rollout.agent.tool_pool import READY
from rlpost.rollout.agent.tools import ToolError, ToolFailed, ToolTimeout, load_tool, result_text


def serve() -> None:
    """Worker side: read ``{"spec", "arguments"}`` lines, answer ``{"status", "text"}``."""
    channel = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # whatever the tool prints goes to stderr, not into the reply channel
    channel.write(READY)
    loaded: dict[str, Callable[..., object]] = {}
    for raw in sys.stdin.buffer:
        request = json.loads(raw)
        spec = request["spec"]
        try:
            if spec not in loaded:
                loaded[spec] = load_tool(spec).fn
            status, text = result_text(loaded[spec](**request["arguments"]))
        except ToolError as e:
            status, text = "error", str(e)
        except ToolTimeout as e:
            status, text = "timeout", str(e)
        except ToolFailed as e:
            status, text = "error", f"failed:\n{e}"
        except Exception as e:  # the tool's failure is a message to the model
            status, text = "error", f"raised {type(e).__name__}: {e}"
        channel.write(json.dumps({"status": status, "text": text}).encode() + b"\n")


if __name__ == "__main__":
    serve()
