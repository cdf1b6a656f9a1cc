"""One line per load of the serve_latency JSON rows in the given logs (bench/device/README.md: a call's summary)."""

import json
import re
import sys
from pathlib import Path

for path in sys.argv[1:]:
    text = Path(path).read_text(errors="replace")
    # From vLLM's and the shared engine's own lines in the log: the answers vLLM ended in an error, and every request
    # the engine handed it (3,009 for loads.sh's 3,001 requests where none faulted: the rest are second attempts).
    # vLLM's line names the tokens ("grammar rejected tokens [2] for request ..."); the service's own warning at the
    # first fault quotes the phrase without them and is not a fault of its own (stop 55 counted it once too often).
    faults = len(re.findall(r"grammar rejected tokens \[", text))
    handed = re.findall(r"handed (\d+) requests to vLLM", text)
    for line in text.splitlines():
        if line.startswith("{") and '"answers_per_s"' in line:
            r = json.loads(line)
            print(Path(path).name, r["load"], r["answers_per_s"], "tok", r["mean_tokens_out"],
                  "label", r["label_ms"]["p50"], r["label_ms"]["p99"], "full", r["full_ms"]["p50"],
                  r["full_ms"]["p99"], "from 1 s", r.get("from_1s_ms"), "cores", r["cpu_cores"],
                  "errors", {k[:40]: n for k, n in r.get("answer_errors", {}).items()},
                  "retries so far", r.get("retries_so_far"), "vLLM faults", faults,
                  "handed", handed[-1] if handed else None)
