"""How many pytest-xdist workers this machine can really run: prints one integer.

`pytest -n auto` counts the CPUs the kernel lists, which on a container can be the host's 16+
while the cgroup quota allows two; each worker runs XLA with 8 simulated devices and imports
torch, so oversubscribing both slows the suite several-fold and, past the memory limit, kills
workers mid-test (seen on CI: 4 workers on a 2-core, 24 GiB machine, 78 minutes, 3 crashed).
The count is the smallest of: CPUs in the affinity mask, the cgroup v2/v1 CPU quota, and one
worker per 8 GiB of memory (cgroup limit or physical), and at least 1.
"""
import math
import os

_GIB = 1024 ** 3
_MEMORY_PER_WORKER = 8 * _GIB


def _read(path):
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return None


def _cgroup_cpus():
  quota = _read('/sys/fs/cgroup/cpu.max')  # cgroup v2: "max 100000" or "200000 100000"
  if quota:
    limit, period = quota.split()[:2]
    if limit != 'max':
      return max(1, math.floor(int(limit) / int(period)))
  limit, period = (_read('/sys/fs/cgroup/cpu/cpu.cfs_quota_us'),
                   _read('/sys/fs/cgroup/cpu/cpu.cfs_period_us'))
  if limit and period and int(limit) > 0:
    return max(1, math.floor(int(limit) / int(period)))
  return None


def _memory_bytes():
  for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
    value = _read(path)
    if value and value.isdigit() and int(value) < 1 << 60:
      return int(value)
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return None


def worker_count():
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:
    cpus = os.cpu_count() or 1
  counts = [cpus]
  if (quota := _cgroup_cpus()) is not None:
    counts.append(quota)
  if (memory := _memory_bytes()) is not None:
    counts.append(memory // _MEMORY_PER_WORKER)
  return max(1, min(counts))


if __name__ == '__main__':
  print(worker_count())
