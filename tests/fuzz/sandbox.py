"""A worker process that judges cases, so that a hang or a memory blow-up costs one case, not the run.

The parent sends pickled cases over the worker's stdin and reads verdicts from its stdout.
Each case is bounded by the worker's *CPU* time (read from /proc), not wall time, so a
busy shared machine does not turn a slow case into a false hang; a wall-clock ceiling
catches a worker that sleeps. On a timeout the worker's Python stack is dumped with
faulthandler (it works even inside a long C call such as ``10**10**9``), then it is killed
and replaced.
"""

from __future__ import annotations

import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fuzz.case import Case
from fuzz.judge import HANG, Verdict

TESTS_DIR = str(Path(__file__).resolve().parents[1])
CPU_LIMIT_S = 2.0        # the property's bound on compiling one case
CHECK_LIMIT_S = 10.0     # and on the round trip of its IR (print, parse, print; twice) and its lowering
COMMANDS_LIMIT_S = 5.0   # and on irc analyze (twice at most) and irc lint
RUN_LIMIT_S = 10.0       # and on irc run on the NumPy reference (graphs under fuzz.commands' size bound)
# what the worker says as it moves on -> (what it is doing then, the phase's CPU bound)
PHASES = {"compiled": ("checking the IR round trip", CHECK_LIMIT_S),
          "commands": ("analyzing and linting", COMMANDS_LIMIT_S),
          "running": ("running on the numpy reference", RUN_LIMIT_S)}
WALL_LIMIT_S = 60.0      # a worker that makes no CPU progress for this long is stuck anyway
MEMORY_LIMIT = 1 << 30   # address space of the worker: a blow-up becomes MemoryError, not swapping

_BOOT = f"""
import sys
sys.path.insert(0, {TESTS_DIR!r})
from fuzz.sandbox import serve
serve(int(sys.argv[1]), int(sys.argv[2]))
"""


def _send(stream, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read_exact(stream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(stream) -> object:
    (n,) = struct.unpack("<Q", _read_exact(stream, 8))
    return pickle.loads(_read_exact(stream, n))


def serve(fd_in: int | None = None, fd_out: int | None = None) -> None:
    """The worker's loop: read a case, judge it, write the verdict.

    The channel is a pair of pipes of its own, not stdin/stdout: an input that makes irc
    read /dev/stdin must not eat the next case.
    """
    import faulthandler
    import resource

    from fuzz.judge import judge

    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ValueError, OSError):
        pass
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=False)
    inp = os.fdopen(fd_in, "rb") if fd_in is not None else sys.stdin.buffer
    out = os.fdopen(fd_out, "wb") if fd_out is not None else sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing irc prints may corrupt the channel
    import irc.analysis.cli  # noqa: F401  (warm the imports before the first timed case)
    import irc.backends.numpy_ref.interpreter  # noqa: F401
    import irc.frontends.arch.builder  # noqa: F401
    import irc.lint.cli  # noqa: F401
    import irc.pipeline  # noqa: F401
    import irc.runtime.init  # noqa: F401
    import irc.runtime.inputs  # noqa: F401

    _send(out, "ready")
    while True:
        try:
            case = _recv(inp)
        except EOFError:
            return
        _send(out, judge(case, lambda name: _send(out, name)))


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


class Sandbox:
    """Judges cases in a child process; restarts it after a hang or a crash of the process itself."""

    def __init__(self, cpu_limit_s: float = CPU_LIMIT_S, phases: dict[str, tuple[str, float]] | None = None):
        self.cpu_limit_s = cpu_limit_s
        self.phases = PHASES if phases is None else phases
        self.proc: subprocess.Popen | None = None
        self.stderr = None
        self.restarts = 0

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONHASHSEED="0")
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", _BOOT, str(to_worker_r), str(from_worker_w)],
                                     stdin=subprocess.DEVNULL, stdout=self.stderr, stderr=self.stderr, env=env,
                                     pass_fds=(to_worker_r, from_worker_w))
        os.close(to_worker_r)
        os.close(from_worker_w)
        self.send = os.fdopen(to_worker_w, "wb", buffering=0)
        self.receive = os.fdopen(from_worker_r, "rb", buffering=0)  # unbuffered: select() sees every reply
        if _recv(self.receive) != "ready":
            raise RuntimeError("fuzz worker did not start")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.send.close()
            self.receive.close()
            self.proc = None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, case: Case) -> Verdict:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        assert self.proc is not None
        pid = self.proc.pid
        cpu0 = _cpu_seconds(pid) or 0.0
        wall0 = time.monotonic()
        try:
            _send(self.send, case)
        except BrokenPipeError:
            return self._died()
        fd = self.receive.fileno()
        limit, phase = self.cpu_limit_s, "compiling"
        while True:
            ready, _, _ = select.select([fd], [], [], 0.02)
            if ready:
                try:
                    reply = _recv(self.receive)
                except (EOFError, pickle.UnpicklingError):
                    return self._died()
                if not isinstance(reply, str):
                    return reply  # type: ignore[return-value]
                cpu0, wall0 = _cpu_seconds(pid) or 0.0, time.monotonic()
                phase, limit = self.phases[reply]
                continue
            cpu = _cpu_seconds(pid)
            spent = (cpu - cpu0) if cpu is not None else (time.monotonic() - wall0)
            if spent > limit or time.monotonic() - wall0 > WALL_LIMIT_S:
                return self._hang(spent, phase)

    def _died(self) -> Verdict:
        code = self.proc.wait() if self.proc else None
        tail = self._stderr_tail()
        self.close()
        self.restarts += 1
        return Verdict("crash", f"the worker process died (exit {code}): {tail[-300:]}", "ProcessDied",
                       _parse_frames(tail))

    def _hang(self, spent: float, phase: str) -> Verdict:
        assert self.proc is not None
        try:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.3)
        except OSError:
            pass
        tail = self._stderr_tail()
        self.close()
        self.restarts += 1
        return Verdict(HANG, f"still {phase} after {spent:.1f} s of CPU time", "Timeout", _parse_frames(tail), spent)

    def _stderr_tail(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        return self.stderr.read()[-20000:].decode("utf-8", "replace")


def _parse_frames(dump: str) -> list[tuple[str, str, int]]:
    """faulthandler prints the most recent call first; verdicts keep the innermost last."""
    block = dump[dump.rfind("most recent call first"):] if "most recent call first" in dump else dump
    frames = [(f, fn, int(n)) for f, n, fn in _FRAME.findall(block)]
    return frames[::-1]
