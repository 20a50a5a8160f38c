"""``reward.fn=code``: the share of the row's test cases that the completion's program passes.

The program is the completion's LAST fenced code block tagged ``python`` (or
``py``, ``python3``) or untagged; a completion with no fence at all is taken
whole as the program, and one with fences but no such closed block has none
(every case fails). Each case runs in a fresh sandbox
(``rlpost.rollout.agent.sandbox``: no network, no new processes, CPU, memory
and wall-clock limits), so a case that loops, crashes, exits early or runs
out of time fails and nothing raises.

Test cases, from the first of these columns the row has:

- ``tests``: a list of ``{"input": str, "output": str}`` (stdin, expected
  stdout) or of ``assert`` statements;
- ``input_output``: ``{"inputs": [...], "outputs": [...]}``, a dict or its JSON
  (APPS, TACO, verl's PRIME data);
- ``test_list``: a list of ``assert`` statements (MBPP);
- ``reward_model["ground_truth"]``: an ``input_output`` value (verl's layout).

A stdin case passes when the program exits normally and its stdout equals
the expected output line by line, ignoring trailing whitespace (stderr is
discarded). An assert case passes when the program, followed by the assert,
runs to the end: a marker printed after the assert proves it ran, so a
program that exits before the assert fails it.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from rlpost.rewards.verifiers.columns import without_special_tokens

TEST_COLUMNS = (
    "'tests' (stdin/stdout pairs or asserts), 'input_output' ({'inputs': [...], 'outputs': "
    "[...]}), 'test_list' (asserts) or reward_model['ground_truth'] (an input_output value)"
)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3"}


@dataclass(frozen=True)
class Case:
    """One test: ``stdin`` fed and ``stdout`` expected, or an ``assert`` statement."""

    stdin: str = ""
    stdout: str | None = None
    assertion: str | None = None


def extract_program(completion: str) -> str | None:
    """The last closed python or untagged fenced block; the whole completion when it
    has no fence; None when it has fences but no such block."""
    text = without_special_tokens(completion)
    if "```" not in text:
        return text
    blocks = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else None


def _json(value: object) -> Any:  # a JSON document's value
    return json.loads(value) if isinstance(value, str) else value


def _io_cases(value: object) -> list[Case]:
    spec = _json(value)
    if not isinstance(spec, dict) or not {"inputs", "outputs"} <= set(spec):
        raise ValueError(f"input_output must hold 'inputs' and 'outputs', got {str(value)[:80]!r}")
    if spec.get("fn_name"):
        raise ValueError(
            f"input_output names fn_name={spec['fn_name']!r} (call-based tests); "
            "only stdin/stdout tests are supported: give 'inputs' and 'outputs' as strings"
        )
    inputs, outputs = spec["inputs"], spec["outputs"]
    if len(inputs) != len(outputs):
        raise ValueError(f"input_output has {len(inputs)} inputs but {len(outputs)} outputs")
    return [_stdio_case(i, o) for i, o in zip(inputs, outputs)]


def _stdio_case(stdin: object, stdout: object) -> Case:
    if isinstance(stdout, list):  # APPS sometimes stores the output as its lines
        stdout = "\n".join(map(str, stdout))
    if not isinstance(stdin, str) or not isinstance(stdout, str):
        raise ValueError(f"a stdin/stdout test needs strings, got {stdin!r} -> {stdout!r}")
    return Case(stdin=stdin, stdout=stdout)


def _listed_cases(value: object) -> list[Case]:
    cases = []
    for item in _json(value):
        if isinstance(item, str):
            cases.append(Case(assertion=item))
        elif isinstance(item, dict) and {"input", "output"} <= set(item):
            cases.append(_stdio_case(item["input"], item["output"]))
        else:
            raise ValueError(
                f"a test is an assert string or {{'input': ..., 'output': ...}}, got {item!r}"
            )
    return cases


def cases_of(row: dict) -> list[Case]:
    """The row's test cases (see the module docstring); ValueError when it has none."""
    if row.get("tests") is not None:
        cases = _listed_cases(row["tests"])
    elif row.get("input_output") is not None:
        cases = _io_cases(row["input_output"])
    elif row.get("test_list") is not None:
        cases = [Case(assertion=str(a)) for a in _json(row["test_list"])]
    elif isinstance(row.get("reward_model"), dict) and "ground_truth" in row["reward_model"]:
        cases = _io_cases(row["reward_model"]["ground_truth"])
    else:
        raise ValueError(f"the row has no test cases: add {TEST_COLUMNS} (columns: {sorted(row)})")
    if not cases:
        raise ValueError("the row's test cases are an empty list; give at least one")
    return cases


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _source(program: str, case: Case, marker: str) -> str:
    """The sandboxed script: stdin from the case, stderr discarded, the program run by
    ``exec`` (so its own ``from __future__`` imports stay first), then the assert."""
    lines = [
        "import io as _io, sys as _sys",
        f"_sys.stdin = _io.TextIOWrapper(_io.BytesIO({case.stdin.encode()!r}), encoding='utf-8')",
        "_sys.stderr = _io.StringIO()",
        "del _io, _sys",
    ]
    if case.assertion is None:
        lines.append(f"exec(compile({program!r}, '<solution>', 'exec'))")
    else:
        lines += [
            "try:",
            f"    exec(compile({program!r}, '<solution>', 'exec'))",
            "except SystemExit:",  # the assert still runs after the program's sys.exit()
            "    pass",
            case.assertion,
            f"print({marker!r})",
        ]
    return "\n".join(lines) + "\n"


def _passed(program: str, case: Case, wall_s: float, memory_mb: int) -> bool:
    from rlpost.rollout.agent.sandbox import SandboxLimits, run_sandboxed

    marker = f"rlpost-assert-passed-{secrets.token_hex(8)}"
    expected = case.stdout if case.stdout is not None else marker
    limits = SandboxLimits(
        wall_s=wall_s,
        cpu_s=wall_s,
        memory_mb=memory_mb,
        max_output_chars=len(expected) + 4096,  # longer output is cut, and fails the case
    )
    result = run_sandboxed(_source(program, case, marker), limits)
    if result.status != "ok":
        return False
    if case.stdout is None:
        return _lines(result.output)[-1:] == [marker]
    return _lines(result.output) == _lines(case.stdout)


def code_reward(
    completion: str,
    row: dict,
    *,
    timeout_s: float = 5.0,
    total_timeout_s: float = 20.0,
    max_cases: int = 16,
    memory_mb: int = 512,
) -> dict[str, float]:
    """``{"code": passed / cases}`` over the row's first ``max_cases`` test cases.

    Each case is stopped after ``timeout_s`` seconds (wall and CPU); once
    ``total_timeout_s`` is spent the cases left fail unrun, which keeps a call
    inside the default ``reward.timeout_s`` (30 s) even for a program that
    loops on every case. A program that does not compile fails every case
    without starting a sandbox.
    """
    cases = cases_of(row)[:max_cases]
    program = extract_program(completion)
    if program is None or not program.strip():
        return {"code": 0.0}
    try:
        compile(program, "<solution>", "exec")
    except (SyntaxError, ValueError, RecursionError):  # ValueError: a null byte
        return {"code": 0.0}
    deadline = time.monotonic() + total_timeout_s
    passed = 0
    for case in cases:
        left = deadline - time.monotonic()
        if left <= 0.1:
            break
        passed += _passed(program, case, min(timeout_s, left), memory_mb)
    return {"code": passed / len(cases)}
