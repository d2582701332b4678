"""Where the CPU goes during a twin run: samples the cumulative CPU time of every splitserve
process (server, each worker, bench) from /proc every 0.5 s while a command runs, then prints the
CPU seconds per role (user and system) with the minor page faults, and the machine's mean busy
cores. Linux only.

    python benchmarks/twin/cpuwatch.py python -m splitserve.cli twin \
        --profile-dir benchmarks/twin/results/profile --load 0.9 --duration 60 --out /tmp/twcpu
"""
import os, subprocess, sys, time
HZ = os.sysconf("SC_CLK_TCK")
def cpu_of(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) / HZ, int(f[12]) / HZ, int(f[7])
    except OSError:
        return None
def cmd_of(pid):
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
    except OSError:
        return ""
def machine():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)
proc = subprocess.Popen(sys.argv[1:])
last = {}
roles = {}
m0 = machine(); t0 = time.time()
while proc.poll() is None:
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        c = cmd_of(pid)
        if "splitserve" not in c: continue
        role = ("worker0" if "--id 0" in c else "worker1" if "--id 1" in c else "worker") if "serve.worker" in c else \
               "bench" if " bench " in c else "server" if " serve " in c else "twin" if " twin " in c else "other"
        v = cpu_of(pid)
        if v is not None:
            last[pid] = v; roles[pid] = role
    time.sleep(0.5)
m1 = machine(); wall = time.time() - t0
agg = {}
for pid, v in last.items():
    agg[roles[pid]] = [a + b for a, b in zip(agg.get(roles[pid], (0, 0, 0)), v)]
print("wall", round(wall, 1), "machine busy cores", round((m1[0] - m0[0]) / (m1[1] - m0[1]) * os.cpu_count(), 2))
for k, (user, system, faults) in sorted(agg.items()):
    print(f"  {k:8s} {user + system:7.1f} cpu-s  (user {user:.1f}, system {system:.1f}; {faults} minor faults)")
