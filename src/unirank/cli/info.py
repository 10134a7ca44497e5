"""``unirank info``: what was detected, where each number came from, and why not the others.

Never imports torch: it answers in about the time ``python -c pass`` takes.
"""

from __future__ import annotations

import argparse
import json
import os

from unirank.words import counted

_FIELDS = (
    "launcher", "rank", "local_rank", "world_size", "local_world_size", "node_rank",
    "num_nodes", "master_addr", "master_port", "job_id", "step_id", "node_name", "hosts",
    "launch_required", "planned_tasks",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` for machine-readable output."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _cpus() -> tuple[str, list[int]]:
    """The CPUs this process may run on (``--numa-binding``, ``taskset``, ``srun --cpu-bind``)
    and the NUMA nodes they sit on."""
    from unirank import numa

    topology = numa.read_topology()
    cpus = frozenset().union(*topology.nodes.values())
    return numa.format_cpus(cpus), list(topology.nodes)


def main(args: argparse.Namespace) -> int:
    """Print the report. Reads: the whole environment (through launcher detection), and the
    PET_* variables that set ``unirank run``'s options."""
    from unirank.launchers import detect, explain

    env = detect()
    candidates = explain()
    if args.json:
        payload = env.to_dict()
        payload["cpus"], payload["numa_nodes"] = _cpus()
        payload["candidates"] = [
            {"launcher": c.name, "status": c.status, "reason": c.reason} for c in candidates
        ]
        print(json.dumps(payload, indent=2, sort_keys=False))
        return 0
    data = env.to_dict()
    width = max(len(f) for f in _FIELDS)
    print(f"unirank: detected launcher '{env.launcher}'")
    for name in _FIELDS:
        value = data[name]
        if name == "hosts":
            value = ",".join(value) if value else "-"
        elif value is None:
            value = "-"
        source = env.sources.get(name, "")
        print(f"  {name:<{width}} = {value}" + (f"   [{source}]" if source else ""))
    cpus, nodes = _cpus()
    print(f"  {'cpus':<{width}} = {cpus}   [NUMA node{'s' * (len(nodes) > 1)} "
          f"{','.join(map(str, nodes))}]")
    if env.must_launch:
        tasks = env.planned_tasks or 1
        print(
            f"note: this is a Slurm allocation shell with {counted(tasks, 'task')} but no srun "
            "step; "
            "start the tasks with `srun python script.py` or `unirank run script.py`."
        )
    elif env.launch_required:
        print("note: this is a Slurm allocation shell holding one task and no srun step; "
              "a program started here runs as that task, at world size 1.")
    from unirank.cli.runoptions import environ_defaults

    pet = environ_defaults(os.environ)
    if pet:
        print("unirank run (and torchrun) take from the environment: " + ", ".join(pet))
    print("launchers (in precedence order):")
    for cand in candidates:
        print(f"  {cand.name:<16} {cand.status:<9} {cand.reason}")
    return 0
