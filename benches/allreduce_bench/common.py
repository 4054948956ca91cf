"""Helpers shared by the bench's modules: error texts, sizes, logging, input ranges, the
watchdog (no torch)."""

import faulthandler
import math
import os
import re
import sys
import threading
import time

ERROR_CHARS = 2000


def describe(exc):
    """One error's text without the C++ stack torch appends."""
    text = f"{type(exc).__name__}: {exc}"
    cut = text.find("Exception raised from")
    if cut > 0:
        text = text[:cut]
    text = " ".join(text.split())
    if len(text) > ERROR_CHARS:
        text = text[: ERROR_CHARS - 3] + "..."
    return text


def format_bytes(value):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{unit}"
    return str(value)


def log(rank, message):
    if rank == 0:
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
        sys.stderr.flush()


def torch_at_least(torch_version, major, minor):
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    if not match:
        return True
    return (int(match.group(1)), int(match.group(2))) >= (major, minor)


def exponent_range(world, max_ops):
    """bf16 exponent fields [lo, hi] for the random inputs.

    In-place contenders feed each op's result to the next, so within one replay values grow by
    up to world**ops. The range keeps the largest value finite after max_ops ops and keeps
    every input normal (never zero, never subnormal); eight exponents apart at most, so a sum
    of two inputs is exact in fp32 and the reference rounds once.
    """
    growth = math.ceil(math.log2(max(world, 2))) * (max_ops + 1)
    hi = min(131, 253 - growth)
    lo = hi - 7
    if lo < 1:
        lo, hi = 1, 8
    return lo, hi


class Watchdog:
    """Ends the process when one step takes longer than `timeout` seconds.

    A Python thread reports the stuck step and calls `on_expire` (which writes what was measured)
    before os._exit; faulthandler, which needs no interpreter lock, is armed a little later as a
    backstop. torchrun then stops the other ranks.
    """

    def __init__(self, rank, timeout, on_expire):
        self.rank = rank
        self.timeout = timeout
        self.on_expire = on_expire
        self.lock = threading.Lock()
        self.step = "start-up"
        self.last = time.monotonic()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="bench-watchdog", daemon=True)
        self.thread.start()
        self._arm_faulthandler()

    def _arm_faulthandler(self):
        try:
            faulthandler.cancel_dump_traceback_later()
            faulthandler.dump_traceback_later(self.timeout + 30.0, exit=True)
        except Exception:
            pass

    def kick(self, step, timeout=None):
        with self.lock:
            self.step = step
            self.last = time.monotonic()
            if timeout is not None:
                self.timeout = timeout
        self._arm_faulthandler()

    def stop(self):
        self.stopped = True
        try:
            faulthandler.cancel_dump_traceback_later()
        except Exception:
            pass

    def _run(self):
        while not self.stopped:
            time.sleep(0.5)
            with self.lock:
                idle = time.monotonic() - self.last
                step = self.step
                timeout = self.timeout
            if self.stopped or idle <= timeout:
                continue
            sys.stderr.write(
                f"rank {self.rank}: no progress for {idle:.0f} s during {step}; ending the run\n"
            )
            sys.stderr.flush()
            try:
                self.on_expire(f"no progress for {idle:.0f} s during {step}")
            except Exception:
                pass
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(3)


class Fatal(Exception):
    """A failure after which the ranks may no longer issue the same collectives."""
