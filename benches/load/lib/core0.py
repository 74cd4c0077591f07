#!/usr/bin/env python3
"""Keep core 0 for the server under test, and give it back afterwards.

    core0.py hold SAVEFILE      # every task that may leave core 0 is held to the other cores
    core0.py release SAVEFILE   # every task held gets its own CPU set back

The layout the suite measures puts the server under test alone on core 0, but a
machine runs its own services (databases, brokers) and kernel threads on every
core, and each time one of them wakes on core 0 the server waits: a stop of a
few milliseconds there lands in the p99 of every proxy and not in direct's,
whose server runs on core 1. `hold` takes core 0 out of the CPU set of every
thread that allows it (processes, their threads, unbound kernel threads such
as `kdamond`) and out of the workqueue's unbound cpumask, and writes what it
changed to SAVEFILE; `release` puts back exactly that, skipping a thread that
has exited since (a reused thread id is told apart by its start time).
Per-CPU kernel threads cannot move and stay; a process's own thread bound to
core 0 (RabbitMQ binds an Erlang scheduler to each core) is moved to the other
cores. Without root only the caller's own processes move. Prints one JSON line
with the counts.
"""
import json
import os
import sys

WORKQUEUE = "/sys/devices/virtual/workqueue/cpumask"
PF_KTHREAD = 0x00200000  # a kernel thread, in the flags of /proc/TID/stat


def read_stat(tid):
    """/proc/TID/stat's fields from the third on (state = [0], flags = [6],
    start time = [19]); the command name before them may hold spaces."""
    with open(f"/proc/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def threads():
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            yield int(pid), int(tid)


def hold(path):
    saved, pinned, denied, procs, wq = [], 0, 0, set(), None
    me = os.getpid()
    others = set(range(os.cpu_count())) - {0}
    try:
        for pid, tid in threads():
            if pid == me:
                continue
            try:
                cpus = os.sched_getaffinity(tid)
                if 0 not in cpus:
                    continue
                stat = read_stat(tid)
                if cpus == {0} and int(stat[6]) & PF_KTHREAD:
                    pinned += 1  # a per-CPU kernel thread: it cannot move
                    continue
                # A process's own thread bound to core 0 (RabbitMQ binds its Erlang
                # schedulers one per core) moves too, to every other core.
                os.sched_setaffinity(tid, (cpus - {0}) or others)
            except PermissionError:
                denied += 1
                continue
            except OSError:  # exited, or a kernel thread that may not move
                pinned += 1
                continue
            saved.append([tid, stat[19], sorted(cpus)])
            procs.add(pid)
        try:
            with open(WORKQUEUE) as f:
                old = f.read().strip()
            mask = int(old, 16) & ~1
            if mask:
                with open(WORKQUEUE, "w") as f:
                    f.write(f"{mask:x}")
                wq = old
        except (OSError, ValueError):
            pass
    finally:
        # Whatever was moved, even if interrupted: `release` must find it.
        with open(path, "w") as f:
            json.dump({"threads": saved, "workqueue_cpumask": wq}, f)
    print(json.dumps({"moved_threads": len(saved), "moved_processes": len(procs),
                      "left_on_core0": pinned, "not_permitted": denied,
                      "workqueue_moved": wq is not None}))


def release(path):
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return
    back = 0
    for tid, started, cpus in state["threads"]:
        try:
            if read_stat(tid)[19] == started:
                os.sched_setaffinity(tid, set(cpus))
                back += 1
        except OSError:
            pass
    if state.get("workqueue_cpumask"):
        try:
            with open(WORKQUEUE, "w") as f:
                f.write(state["workqueue_cpumask"])
        except OSError:
            pass
    os.unlink(path)
    print(json.dumps({"restored_threads": back}))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("hold", "release"):
        sys.exit("usage: core0.py hold|release SAVEFILE")
    (hold if sys.argv[1] == "hold" else release)(sys.argv[2])
