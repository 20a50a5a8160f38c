"""``rlpost.launch.import_in_background``: the driver's imports made while Ray starts."""

from __future__ import annotations

import builtins
import importlib
import sys
import threading

import pytest

from rlpost.launch import import_in_background


def test_the_import_runs_on_a_daemon_thread_and_a_failure_is_raised_where_it_is_used(
    tmp_path, monkeypatch
):
    # The module's body waits for the test's gate: the call must return before
    # the import ends.
    (tmp_path / "gated_module_for_test.py").write_text(
        "import builtins\nbuiltins.gate_for_test.wait(10)\nVALUE = 42\n"
    )
    (tmp_path / "broken_module_for_test.py").write_text("raise ImportError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(builtins, "gate_for_test", threading.Event(), raising=False)
    thread_errors: list = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)

    broken = import_in_background(("broken_module_for_test", "gated_module_for_test"))
    gated = import_in_background(("gated_module_for_test",))
    assert broken.daemon and gated.daemon  # neither holds the process open at its end
    assert gated.is_alive()  # still importing: the gate is shut
    assert not hasattr(sys.modules.get("gated_module_for_test"), "VALUE")

    builtins.gate_for_test.set()
    broken.join(10)
    gated.join(10)
    assert not broken.is_alive() and not gated.is_alive()
    assert importlib.import_module("gated_module_for_test").VALUE == 42
    with pytest.raises(ImportError, match="broken on purpose"):
        importlib.import_module("broken_module_for_test")
    assert thread_errors == []  # the failure did not escape the thread
    for name in ("gated_module_for_test", "broken_module_for_test"):
        sys.modules.pop(name, None)
