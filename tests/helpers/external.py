"""Things some tests need from outside Python (a browser, vLLM): skip with how to get them, but
fail in CI (`CI=true`), where their absence would hide a broken install step."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(what: str, install: str) -> None:
    """Skip (one line: what is missing and the command that installs it), or fail in CI."""
    msg = f"{what} is not installed; install it with: {install}"
    if in_ci():
        pytest.fail(f"CI needs {msg}", pytrace=False)
    pytest.skip(msg)


def cannot(reason: str | None) -> None:
    """Skip with `reason` (why this machine cannot make network namespaces, say), or fail in CI: the
    emulated WAN and internet tests must run there (CI runs as root with iproute2 and nftables)."""
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI must run this test: {reason}", pytrace=False)
    pytest.skip(reason)


def require_chromium() -> tuple[str, str]:
    """(chromium, chromedriver) executables, for the leaderboard's browser test."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        missing("Chromium with its driver", "sudo apt-get install -y chromium chromium-driver")
    return browser, driver


def require_vllm() -> None:
    """vLLM runs in its own environment (README, "vLLM"). Elsewhere a run leaves its tests out
    (tests/conftest.py) unless it names them, and then they skip here; CI runs them in that
    environment with `-m vllm`, where a missing vLLM fails."""
    from node.engines.vllm import vllm_available

    if vllm_available():
        return
    if in_ci() and os.environ.get("HETERO_REQUIRE_VLLM") == "1":
        pytest.fail("CI's vLLM run needs vLLM: see README, section 'vLLM'", pytrace=False)
    pytest.skip("vLLM is not installed here; its tests run in the vLLM environment: see README, section 'vLLM'")
