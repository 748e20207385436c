"""Generate the blocking twin of every asyncio control flow in stormguard (one source).

    python tools/unasync.py            # rewrite the generated blocks
    python tools/unasync.py --check    # exit 1 if a generated block is stale (tests run it)

A source file holds named blocks::

    # unasync: source <name>
    async def _async(self, nxt: AsyncNext, ...) -> Any:
        ...
    # unasync: end
    ...
    # unasync: generated <name> (python tools/unasync.py; do not edit)
    def _sync(self, nxt: Next, ...) -> Any:
        ...
    # unasync: end

The generated block is the source block with ``await``/``async`` removed and the names
of :data:`NAMES` replaced (httpcore's unasync, line by line). Two markers say where the
blocking code differs: a line ending in ``# async only`` is left out, and a comment line
``# sync: <code>`` stands for the line after it: the twin has ``<code>`` there instead.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = [
    "src/stormguard/resilience/_base.py",
    "src/stormguard/resilience/breaker.py",
    "src/stormguard/resilience/bulkhead.py",
    "src/stormguard/resilience/concurrency.py",
    "src/stormguard/resilience/fallback.py",
    "src/stormguard/resilience/retry.py",
    "src/stormguard/resilience/shaper.py",
    "src/stormguard/resilience/throttle.py",
    "src/stormguard/resilience/timeout.py",
    "src/stormguard/resilience/pipeline/__init__.py",
    "src/stormguard/integrations/httpx.py",
    "src/stormguard/ratelimit/limiter.py",
]

#: asyncio name -> blocking name (whole words)
NAMES = {
    "_async": "_sync",
    "_achain": "_chain",
    "achain": "chain",
    "AsyncNext": "Next",
    "ainvoke": "invoke",
    "acall": "call",
    "asleep": "sleep",
    "_acquire_async": "_acquire_blocking",
    "_depart_async": "_depart_blocking",
    "_apause": "_pause",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "aclose": "close",
    "AsyncRateLimiter": "RateLimiter",
    "ahit_all": "hit_all",
    "ahit": "hit",
    "apeek": "peek",
    "areset": "reset",
    "aping": "ping",
    "AsyncResilientTransport": "ResilientTransport",
    "AsyncBaseTransport": "BaseTransport",
    "AsyncHTTPTransport": "HTTPTransport",
    "handle_async_request": "handle_request",
    "aiter_raw": "iter_raw",
}

_WORDS = re.compile(r"\b(" + "|".join(map(re.escape, NAMES)) + r")\b")
_REWRITES = [
    (re.compile(r"\bawait\s+"), ""),
    (re.compile(r"\basync\s+(def|with|for)\b"), r"\1"),
    (re.compile(r"\bAwaitable\[(\w+)\]"), r"\1"),
]
_MARK = re.compile(r"^\s*# unasync: (source|generated|end)\b\s*(\S*)")
_SYNC = "# sync: "
_ASYNC_ONLY = "  # async only"


def twins(lines: list[str]) -> list[str]:
    """The blocking form of a source block."""
    out: list[str] = []
    instead: str | None = None
    for line in lines:
        if line.lstrip().startswith(_SYNC):
            instead = line.lstrip()[len(_SYNC):].rstrip()
            continue
        if instead is not None:
            out.append(line[: len(line) - len(line.lstrip())] + instead + "\n")
            instead = None
        elif not line.rstrip().endswith(_ASYNC_ONLY):
            out.append(twin(line))
    return out


def twin(line: str) -> str:
    """The blocking form of one source line."""
    line = _WORDS.sub(lambda m: NAMES[m[1]], line)
    for pattern, repl in _REWRITES:
        line = pattern.sub(repl, line)
    return line


def generate(text: str, path: str) -> str:
    """``text`` with every generated block rewritten from its source block."""
    lines = text.splitlines(keepends=True)
    sources: dict[str, list[str]] = {}
    block: list[str] | None = None
    for line in lines:
        m = _MARK.match(line)
        if m and m[1] == "source":
            block = sources.setdefault(m[2], [])
        elif m and m[1] == "end":
            block = None
        elif m is None and block is not None:
            block.append(line)
    out: list[str] = []
    skipping = False
    for line in lines:
        m = _MARK.match(line)
        if skipping:
            if m and m[1] == "end":
                out.append(line)
                skipping = False
            continue
        out.append(line)
        if m and m[1] == "generated":
            if m[2] not in sources:
                raise SystemExit(f"{path}: generated block {m[2]!r} has no source block")
            out.extend(twins(sources[m[2]]))
            skipping = True
    if skipping:
        raise SystemExit(f"{path}: a generated block has no '# unasync: end'")
    return "".join(out)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name in FILES:
        path = ROOT / name
        text = path.read_text()
        new = generate(text, name)
        if new != text:
            stale.append(name)
            if not check:
                path.write_text(new)
    if stale:
        verb = "stale (run python tools/unasync.py)" if check else "regenerated"
        print("\n".join(f"{name}: {verb}" for name in stale))
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
