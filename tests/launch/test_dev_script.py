"""launch/dev.sh runs under `set -euo pipefail`: a pipe whose reader stops early kills the script
with SIGPIPE (exit 141), as it once did in CI, at random, before any test ran."""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_allocator_lookup_reads_a_long_library_list_to_the_end():
    (line,) = [l for l in open(os.path.join(ROOT, "launch", "dev.sh")) if l.startswith("tcmalloc=")]
    assert "/sbin/ldconfig -p 2>/dev/null" in line
    # The match first, then far more than a pipe's buffer: a reader that exits at the match
    # leaves the writer to die of SIGPIPE every time, not just by chance.
    fake = 'listing() { echo "  libtcmalloc_minimal.so.4 (libc6,x86-64) => /x/libtcmalloc_minimal.so.4"; seq 300000; }'
    script = f"set -euo pipefail\n{fake}\n{line.replace('/sbin/ldconfig -p 2>/dev/null', 'listing')}\necho \"$tcmalloc\"\n"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.strip() == "/x/libtcmalloc_minimal.so.4"
