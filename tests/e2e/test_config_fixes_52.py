"""Configuration and command-line fixes of stop 52.

- A value given empty on the command line (`--access-log ""`, `-c ''`,
  `--listen ''`, `--upstream ''`) was taken as not given: the file's
  access log was used where the user meant to override it. It is refused
  (exit 2), as `weir requests`' filters already were.
- `retry: {backoff: 2s}` alone was refused for a `max_backoff` (default 1s)
  the user never wrote: the ceiling now rises to the backoff; a
  `max_backoff` written below it is still refused.
"""

from __future__ import annotations

import subprocess

import pytest

from conftest import binary

BASE = """\
listen: 127.0.0.1:9
pools:
  p:
    endpoints: [http://127.0.0.1:9]
{retry}
models:
  m: {{pool: p}}
"""


def check(tmp_path, *args, retry=""):
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(BASE.format(retry=retry))
    return subprocess.run([binary("weir"), "--check", "-c", str(cfg), *args], capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("flag", ["--access-log", "--listen", "--upstream", "--config"])
def test_an_empty_command_line_value_is_refused(tmp_path, flag):
    r = check(tmp_path, flag, "")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{flag}: must not be empty" in r.stderr, r.stderr


def test_the_same_flags_with_values_pass(tmp_path):
    r = check(tmp_path, "--access-log", "off", "--listen", "127.0.0.1:9")
    assert r.returncode == 0, r.stderr


def test_a_backoff_above_the_default_ceiling_alone_is_accepted(tmp_path):
    r = check(tmp_path, retry="    retry: {attempts: 2, backoff: 2s}")
    assert r.returncode == 0, r.stderr


def test_a_max_backoff_written_below_the_backoff_is_refused(tmp_path):
    r = check(tmp_path, retry="    retry: {attempts: 2, backoff: 2s, max_backoff: 1s}")
    assert r.returncode == 2, r.stderr
    assert "pools.p.retry.max_backoff: must not be less than backoff" in r.stderr, r.stderr


@pytest.mark.parametrize("flag", ["--access-log", "--listen", "--upstream"])
def test_an_empty_value_after_equals_is_refused_not_taken_from_the_next_argument(tmp_path, flag):
    # CLI11 read `--access-log=` as the option without its value and took `--check` for it: Weir then served,
    # writing its access log to a file named "--check".
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(BASE.format(retry=""))
    r = subprocess.run([binary("weir"), "-c", str(cfg), f"{flag}=", "--check"], capture_output=True, text=True,
                       timeout=30, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert f"{flag}: must not be empty" in r.stderr, r.stderr
    assert not (tmp_path / "--check").exists()


def test_requests_id_empty_after_equals_is_refused(tmp_path):
    r = subprocess.run([binary("weir"), "requests", "--db", str(tmp_path / "x.db"), "--id=", "--limit=1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "--id: must not be empty" in r.stderr, r.stderr
