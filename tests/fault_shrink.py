"""Run the graftkit command line with one safetensors file truncated between its header and its tensors.

``python tests/fault_shrink.py FILE [graftkit arguments...]``: the first time graftkit parses ``FILE``'s
header, the file is cut to half its size right after (as a checkpoint being rewritten, or on network
storage, shrinks under a reader). Deterministic: no timing, no second process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from graftkit.weights import safetensors_file as sf

TARGET = Path(sys.argv[1]).resolve()
_parse = sf.read_header
_done = []


def read_header_then_shrink(path):
    parsed = _parse(path)
    if Path(path).resolve() == TARGET and not _done:
        _done.append(True)
        os.truncate(TARGET, TARGET.stat().st_size // 2)
    return parsed


sf.read_header = read_header_then_shrink

if __name__ == "__main__":
    from graftkit.cli import main

    sys.argv = ["graftkit", *sys.argv[2:]]
    main()
