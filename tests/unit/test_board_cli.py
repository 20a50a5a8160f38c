"""The start line of ``rlpost board`` names the address it listens on."""

from __future__ import annotations

import socket

from rlpost.board.cli import listening


def test_a_local_board_prints_its_address():
    assert listening("127.0.0.1", 8470, None) == "http://127.0.0.1:8470/"


def test_another_host_is_printed_as_bound_with_the_token():
    assert listening("10.1.2.3", 8470, "tok") == "http://10.1.2.3:8470/?token=tok"
    assert listening("::1", 8470, None) == "http://[::1]:8470/"


def test_a_wildcard_host_is_printed_and_named_for_other_machines():
    line = listening("0.0.0.0", 8470, "tok")
    assert line.startswith("http://0.0.0.0:8470/?token=tok (every address of this machine")
    assert f"from another: http://{socket.gethostname()}:8470/?token=tok)" in line
    assert "127.0.0.1" not in line
    assert listening("::", 9000, "t").startswith("http://[::]:9000/?token=t ")
