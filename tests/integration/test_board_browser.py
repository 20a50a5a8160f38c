"""``rlpost board`` in a real browser (headless Chromium through Selenium) on run
directories that real short runs wrote: a 3-step GRPO run and a 2-step
``agent=calculator`` run with ``trainer.log_samples=4``, a launch from the form
that trains to the end, one stopped with the stop button (SIGINT: a checkpoint
of the step in progress), and the safety checks over plain HTTP.

Chromium and its driver come from Debian (``apt-get install chromium
chromium-driver``, as .ci/run does); without them the browser tests skip.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

from rlpost.config.compose import compose
from rlpost.models.warmup import SHIPPED_DIR, warmup_key
from tests.cli_in_process import main_in_process, stop_ray

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "TQDM_DISABLE": "1"}
# Both runs start from the bases rlpost ships (model.path: no warm-up; data.val_size
# below would otherwise key a warm-up of its own). The calc run must call its tool.
# Launched runs take their model from the usual cache (~/.cache/rlpost, or
# $RLPOST_BOARD_TEST_CACHE).
CACHE = os.environ.get("RLPOST_BOARD_TEST_CACHE")
ARITH = [f"model.path={SHIPPED_DIR / warmup_key(compose([]))}"]
CALC = ["agent=calculator", f"model.path={SHIPPED_DIR / warmup_key(compose(['agent=calculator']))}"]
SMALL = [
    *([f"model.cache_dir={CACHE}"] if CACHE else []), "data.prompts_per_step=4", "rollout.n=4", "data.val_size=16", "trainer.val_every=1",
    "rollout.kv_cache_gib=0.0625", "trainer.log_samples=4", "trainer.save_final=false",
]  # fmt: skip
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
EVIL = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'


def _train(run_dir: Path, *extra: str) -> None:
    """A short run to its end, in this process (``tests/cli_in_process.py``)."""
    proc = main_in_process([f"trainer.run_dir={run_dir}", *SMALL, *extra], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _board(runs: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """Start ``python -m rlpost.board``; returns it and the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlpost.board", "--runs", str(runs), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"(http://\S+)", line)
    assert m, f"no URL in {line!r}"
    return proc, m.group(1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The runs root: two real runs (one after the other, on one local Ray, stopped
    before the board launches runs of its own) and a hand-written dump whose model
    output is an HTML injection attempt."""
    root = tmp_path_factory.mktemp("board-runs")
    try:
        _train(root / "grpo", "trainer.total_steps=3", *ARITH)
        _train(root / "agent", "trainer.total_steps=2", *CALC)
    finally:
        stop_ray()
    evil = root / "evil"
    (evil / "samples").mkdir(parents=True)
    (evil / "config.yaml").write_text("algo: {name: grpo}\ntrainer: {total_steps: 1}\n")
    (evil / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    sample = {"step": 1, "group": 0, "prompt": EVIL, "completion": EVIL,
              "rewards": {"total": 1.0}, "finish_reason": "stop"}  # fmt: skip
    (evil / "samples" / "step_000001.jsonl").write_text(json.dumps(sample) + "\n")
    return root


@pytest.fixture(scope="module")
def board(runs: Path) -> Iterator[str]:
    proc, url = _board(runs, "--port", str(free_port()), "--allow-launch")
    yield url.rstrip("/")
    proc.terminate()
    proc.wait(timeout=30)
    for record in runs.glob("*/board.json"):  # a launch a failed test left running
        info = json.loads(record.read_text())
        if "exit_code" not in info and Path(f"/proc/{info['pid']}").exists():
            os.kill(info["pid"], signal.SIGKILL)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not (CHROMIUM and DRIVER):
        pytest.skip("no chromium/chromedriver: apt-get install -y chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.implicitly_wait(10)
    yield driver
    driver.quit()


def _none(browser, css: str) -> bool:
    """No element matches ``css`` (asked without the implicit wait)."""
    from selenium.webdriver.common.by import By

    browser.implicitly_wait(0)
    try:
        return browser.find_elements(By.CSS_SELECTOR, css) == []
    finally:
        browser.implicitly_wait(10)


def _wait(check, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def test_the_runs_list_shows_each_run_with_status_and_headline(browser, board, runs):
    from selenium.webdriver.common.by import By

    browser.get(board + "/")
    rows = {
        r.find_element(By.CSS_SELECTOR, "a.run").text: r.text
        for r in browser.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
    }
    assert set(rows) == {"grpo", "agent", "evil"}
    grpo = _metrics(runs / "grpo")
    first, last = grpo[0]["val/accuracy"], grpo[-1]["val/accuracy"]
    assert "finished" in rows["grpo"] and "3 / 3" in rows["grpo"]
    assert f"val/accuracy {first:.3f} → {last:.3f}" in rows["grpo"]
    assert "finished" in rows["agent"] and "calc" in rows["agent"]


def test_a_curve_has_a_point_per_logged_step_and_hover_shows_the_value(browser, board, runs):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    browser.get(board + "/run?run=grpo")
    rows = _metrics(runs / "grpo")
    for key in ("val/accuracy", "reward/mean", "reward/correctness/mean", "timing/generate_s"):
        line = browser.find_element(By.CSS_SELECTOR, f'polyline[data-key="{key}"]')
        logged = [r[key] for r in rows if key in r]
        assert len(line.get_attribute("points").split()) == len(logged), key
    # val/accuracy: steps 0..3 (validation before training and after each step)
    assert len([r for r in rows if "val/accuracy" in r]) == 4
    point = browser.find_elements(By.CSS_SELECTOR, 'circle[data-key="reward/mean"]')[-1]
    ActionChains(browser).move_to_element(point).perform()
    tip = browser.find_element(By.ID, "tip")
    assert _wait(lambda: tip.is_displayed())
    assert tip.text.startswith("reward/mean step 3: ")
    assert float(tip.text.rpartition(": ")[2]) == pytest.approx(rows[-1]["reward/mean"], rel=1e-3)
    titles = {
        c.get_attribute("data-title") for c in browser.find_elements(By.CSS_SELECTOR, ".chart")
    }
    assert {"Reward", "Held-out", "KL", "Entropy", "Clip fraction", "Log-prob gap",
            "Step time (s)", "Tokens/s"} <= titles  # fmt: skip
    # Two runs overlaid, by wall time: one reward/mean line each.
    browser.get(board + "/run?run=grpo&run=agent&x=time")
    lines = browser.find_elements(By.CSS_SELECTOR, 'polyline[data-key="reward/mean"]')
    assert sorted(x.get_attribute("data-run") for x in lines) == ["agent", "grpo"]


def test_a_multi_turn_sample_renders_its_tool_call_and_result(browser, board, runs):
    from selenium.webdriver.common.by import By

    browser.get(board + "/samples?run=agent&kind=step&step=1")
    sample = json.loads(
        (runs / "agent" / "samples" / "step_000001.jsonl").read_text().splitlines()[0]
    )
    call = next(m for m in sample["messages"] if m.get("tool_calls"))["tool_calls"][0]["function"]
    result = next(m for m in sample["messages"] if m["role"] == "tool")["content"]
    first = browser.find_elements(By.CSS_SELECTOR, ".sample")[0]
    assert call["name"] in first.find_element(By.CSS_SELECTOR, ".msg.model .toolcall").text
    assert first.find_element(By.CSS_SELECTOR, ".msg.tool pre").text == result
    assert (
        f"total {sample['rewards']['total']:.4g}"
        in first.find_element(By.CSS_SELECTOR, ".scores").text
    )
    assert "advantage" in first.text
    # Filters: a bound above every reward leaves nothing.
    browser.get(board + "/samples?run=agent&kind=step&step=1&min=2")
    assert _none(browser, ".sample")


def test_the_timeline_draws_a_step_of_the_run_with_its_critical_path(browser, board, runs):
    from selenium.webdriver.common.by import By

    from rlpost.loop.trace_file import critical_path, read_trace, step_spans

    browser.get(board + "/run?run=grpo")
    browser.find_element(By.LINK_TEXT, "timeline").click()
    assert _wait(lambda: "step <b>3</b>" in browser.page_source)  # the newest step
    browser.get(board + "/timeline?run=grpo&step=2")
    outer, spans = step_spans(read_trace(runs / "grpo" / "trace.json"), 2)
    path = critical_path(outer, spans)
    drawn = browser.find_elements(By.CSS_SELECTOR, "svg.timeline rect.span")
    assert len(drawn) == len(spans) + 1  # every span of the step, and the step
    outlined = [r for r in drawn if r.get_attribute("stroke") == "#000"]
    assert [r.get_attribute("data-name") for r in outlined] == [e["name"] for e in path]
    table = [r.text.split() for r in browser.find_elements(By.CSS_SELECTOR, "table.path tbody tr")]
    assert [e["name"] for e in path] == [
        next(w for w in row if w in {e["name"] for e in path}) for row in table
    ]
    assert outlined[0].get_attribute("data-name") == "take_rollouts"


def test_model_output_cannot_inject_html(browser, board):
    from selenium.webdriver.common.by import By

    browser.get(board + "/samples?run=evil&kind=step&step=1")
    assert browser.find_element(By.CSS_SELECTOR, ".completion").text == EVIL
    time.sleep(0.5)
    assert browser.title != "pwned" and _none(browser, "main img")


def _fill(browser, name: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    browser.execute_script("for (const d of document.querySelectorAll('details')) d.open = true;")
    field = browser.find_element(By.NAME, name)
    field.clear()
    field.send_keys(value)


def test_an_invalid_launch_shows_every_error_beside_its_field(browser, board):
    from selenium.webdriver.common.by import By

    browser.get(board + "/launch")
    _fill(browser, "key.trainer.total_steps", "-1")
    _fill(browser, "extra", "trainer.totl_steps=3")
    browser.find_element(By.CSS_SELECTOR, 'button[value="check"]').click()
    steps = browser.find_element(By.CSS_SELECTOR, 'tr[data-key="trainer.total_steps"] ul.errors')
    assert "trainer.total_steps=-1: must be >= 0" in steps.text
    extra = browser.find_element(By.CSS_SELECTOR, 'ul.errors[data-field="extra"]')
    assert "trainer.totl_steps: unknown key" in extra.text
    assert "2 problem(s)" in browser.find_element(By.CSS_SELECTOR, ".result").text


# The stop button's test launches a run through the same form in every run.
@pytest.mark.extended
def test_a_valid_launch_trains_to_the_end_and_is_listed(browser, board, runs):
    from selenium.webdriver.common.by import By

    browser.get(board + "/launch")
    _fill(browser, "name", "launched")
    _fill(browser, "key.trainer.total_steps", "2")
    _fill(browser, "extra", "\n".join([*SMALL, *ARITH]))
    browser.find_element(By.CSS_SELECTOR, 'button[value="check"]').click()
    command = browser.find_element(By.CSS_SELECTOR, ".result pre.command").text
    assert command.startswith("python -m rlpost.main trainer.total_steps=2")
    assert f"trainer.run_dir={(runs / 'launched').resolve()}" in command
    browser.find_element(By.CSS_SELECTOR, 'button[value="launch"]').click()
    assert _wait(lambda: "/run?run=launched" in browser.current_url), browser.page_source[-3000:]
    launched = runs / "launched"
    done = _wait(lambda: "exit_code" in json.loads((launched / "board.json").read_text())
                 or (browser.get(board + "/") and False), timeout=240)  # fmt: skip
    info = json.loads((launched / "board.json").read_text())
    assert done and info["exit_code"] == 0, (launched / "board.log").read_text()[-3000:]
    assert [r["step"] for r in _metrics(launched)] == [0, 1, 2]
    browser.get(board + "/")
    row = next(
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
        if r.find_element(By.CSS_SELECTOR, "a.run").text == "launched"
    )
    assert "finished" in row.text and "2 / 2" in row.text


def test_the_stop_button_checkpoints_a_launched_run_and_shows_it_stopped(browser, board, runs):
    from selenium.webdriver.common.by import By

    browser.get(board + "/launch")
    _fill(browser, "name", "stopped")
    _fill(browser, "key.trainer.total_steps", "200")  # far more than it gets to
    # Later lines win: validation only at step 0, no dumps, only the stop checkpoints,
    # the HF engine (it starts sooner than vLLM on a CPU).
    quick = ["trainer.val_every=0", "trainer.log_samples=0", "trainer.save_every=0",
             "rollout.name=hf", "data.prompts_per_step=2", "rollout.n=2"]  # fmt: skip
    _fill(browser, "extra", "\n".join([*SMALL, *ARITH, *quick]))
    browser.find_element(By.CSS_SELECTOR, 'button[value="check"]').click()
    command = browser.find_element(By.CSS_SELECTOR, ".result pre.command").text
    assert command.startswith("python -m rlpost.main trainer.total_steps=200")
    assert f"trainer.run_dir={(runs / 'stopped').resolve()}" in command
    browser.find_element(By.CSS_SELECTOR, 'button[value="launch"]').click()
    assert _wait(lambda: "/run?run=stopped" in browser.current_url), browser.page_source[-3000:]
    stopped = runs / "stopped"
    metrics, log = stopped / "metrics.jsonl", stopped / "board.log"
    # Steps 0 (validation) and 1 logged: a stop during start-up leaves nothing to resume.
    started = _wait(lambda: metrics.exists() and metrics.read_text().count("\n") >= 2, timeout=240)
    assert started, log.read_text()[-3000:]
    button = browser.find_element(By.CSS_SELECTOR, "form.stop button")
    assert button.text == "stop (SIGINT: checkpoint, then exit)"
    sent = time.monotonic()
    button.click()
    assert _wait(lambda: browser.current_url.endswith("/stop"))
    assert "it stops after the current step" in browser.find_element(By.TAG_NAME, "main").text
    done = _wait(lambda: "exit_code" in json.loads((stopped / "board.json").read_text())
                 or (browser.get(board + "/") and False), timeout=120)  # fmt: skip
    stop_s = time.monotonic() - sent
    info = json.loads((stopped / "board.json").read_text())
    assert done and info["exit_code"] == 130, log.read_text()[-3000:]
    last = _metrics(stopped)[-1]["step"]
    assert 1 <= last < 200
    assert [p.name for p in (stopped / "checkpoints").iterdir()] == [f"step_{last:06d}"]
    assert (stopped / "checkpoints" / f"step_{last:06d}" / "COMPLETE").exists()
    assert f"stopped by SIGINT after step {last}" in log.read_text()
    browser.get(board + "/")
    row = next(
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
        if r.find_element(By.CSS_SELECTOR, "a.run").text == "stopped"
    )
    assert "stopped" in row.text and f"{last} / 200" in row.text
    assert row.find_element(By.CSS_SELECTOR, ".checkpoint").text == f"checkpoint of step {last}"
    browser.get(board + "/run?run=stopped")
    shown = browser.find_element(By.CSS_SELECTOR, ".runinfo .checkpoint").text
    assert shown.startswith(f"checkpoint of step {last}: {stopped.resolve()}/checkpoints/")
    assert f"goes on from step {last + 1}" in shown
    assert _none(browser, "form.stop")  # nothing left to stop
    print(f"stop button: checkpoint of step {last}, exit 130 seen {stop_s:.1f} s after the click")


def _get(url: str, headers: dict | None = None, opener=None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_paths_outside_the_runs_root_are_refused(board, runs, tmp_path):
    assert _get(board + "/files/grpo/config.yaml")[0] == 200
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "config.yaml").write_text("token: x\n")
    (runs / "link").symlink_to(secret)
    try:
        for path in ("/files/..%2F..%2Fetc%2Fpasswd", "/files/%2Fetc%2Fpasswd",
                     "/files/link/config.yaml", "/run?run=..", "/run?run=%2Fetc",
                     "/samples?run=..%2F..", "/api/metrics?run=link"):  # fmt: skip
            status, text = _get(board + path)
            assert status in (403, 404), (path, status, text[:200])
            assert "token: x" not in text and "root:" not in text
    finally:
        (runs / "link").unlink()


def test_another_host_needs_the_printed_token(runs):
    proc, url = _board(runs, "--host", "0.0.0.0", "--port", str(free_port()))
    try:
        token = url.partition("?token=")[2]
        base = url.partition("?")[0].rstrip("/")
        assert token
        for path in ("/", "/files/grpo/config.yaml", "/static/board.js", "/launch"):
            assert _get(base + path)[0] == 403, path
        assert _get(base + "/?token=wrong")[0] == 403
        # Redirected to the same page without the token, which now lives in a cookie.
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        status, page = _get(f"{base}/?token={token}", opener=opener)
        assert status == 200 and "grpo" in page
        assert [c.name for c in jar] == ["rlpost_board_token"]
        assert _get(base + "/files/grpo/config.yaml", opener=opener)[0] == 200
        assert _get(base + "/files/grpo/config.yaml", {"X-Board-Token": token})[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
