"""Processes a test started, found by a mark in their environment (every process a
subprocess starts inherits it: a JVM, Spark's Python daemon and workers, a zygote)."""

from __future__ import annotations

import os
import time

MARK = "PGCDC_TEST_PROCESS_MARK"


def marked(mark: str) -> list[int]:
    """PIDs of the processes whose environment holds the mark."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def left_behind(mark: str, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
