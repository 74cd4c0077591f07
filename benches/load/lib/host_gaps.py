#!/usr/bin/env python3
"""How often this core stops running us: a busy loop reads the monotonic clock
for SECONDS and counts the gaps between two reads longer than 1 ms. A gap is
time the core spent elsewhere: another task of this machine (a service, a
kernel thread) or, in a virtual machine, the host running something else on
the vCPU's physical core, which no counter inside the guest shows.

    host_gaps.py CORE SECONDS     # prints one JSON line

`run.sh` runs it on both cores at once, pinned with `taskset`, before the
rounds: a p99 of a few milliseconds is the server's only on a host whose cores
do not themselves stop for that long.
"""
import json
import sys
import time

core, seconds = int(sys.argv[1]), float(sys.argv[2])
clock = time.perf_counter_ns
start = last = clock()
end = start + int(seconds * 1e9)
gaps, lost, longest = 0, 0, 0
while last < end:
    now = clock()
    gap = now - last
    if gap > 1_000_000:
        gaps += 1
        lost += gap
        longest = max(longest, gap)
    last = now
elapsed = last - start
print(json.dumps({
    "core": core,
    "seconds": round(elapsed / 1e9, 3),
    "gaps_over_1ms": gaps,
    "lost_pct": round(lost / elapsed * 100, 2),
    "longest_ms": round(longest / 1e6, 2),
}))
