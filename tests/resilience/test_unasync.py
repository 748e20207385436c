"""The blocking twins are generated from the asyncio source: they must not drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import unasync  # noqa: E402


def test_generated_blocking_code_is_up_to_date() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "unasync.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_listed_file_has_a_generated_block() -> None:
    for name in unasync.FILES:
        assert "# unasync: generated" in (ROOT / name).read_text(), name


def test_the_rewrite() -> None:
    src = '''# unasync: source x
    async def _async(self, nxt: AsyncNext) -> Awaitable[int]:
        async with lock:
            await self._clock.asleep(1)  # async only
        # sync: return "blocking"
        return await nxt()
# unasync: end
# unasync: generated x
stale
# unasync: end
'''
    out = unasync.generate(src, "x.py")
    assert out.split("# unasync: generated x\n")[1] == '''    def _sync(self, nxt: Next) -> int:
        with lock:
        return "blocking"
# unasync: end
'''
    with pytest.raises(SystemExit, match="no source block"):
        unasync.generate("# unasync: generated y\n# unasync: end\n", "y.py")
