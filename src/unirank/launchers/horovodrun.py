"""Workers started by Horovod's ``horovodrun`` (and ``horovod.run``) with its gloo controller.

horovodrun gives each worker ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``,
``HOROVOD_LOCAL_SIZE``, ``HOROVOD_CROSS_RANK``, ``HOROVOD_CROSS_SIZE`` and ``HOROVOD_HOSTNAME``
(the host's name as ``-H`` gave it), plus the address of its gloo rendezvous server
(``HOROVOD_GLOO_RENDEZVOUS_ADDR``/``_PORT``), and no ``RANK``/``MASTER_*``.

* The node rank is ``HOROVOD_CROSS_RANK`` and the node count ``HOROVOD_CROSS_SIZE``: Horovod's
  cross communicator joins the ranks with the same local rank, one per host, so these are exact
  when every host has the same number of slots (``-H a:4,b:4``); with uneven slots a higher local
  rank sees only the hosts that have it.
* The master (for a torch.distributed backend started under horovodrun, e.g. ``--backend gloo``):
  ``MASTER_ADDR``, else the rendezvous server's host (the launch host, which every worker
  reaches); ``MASTER_PORT``, else a port derived from the rendezvous port (unirank's job formula,
  :mod:`unirank.rendezvous`), so concurrent horovodrun jobs on one host get different ports.
* ``auto`` picks the horovod backend under this launcher (:mod:`unirank.runtime.backends`).
"""

from __future__ import annotations

from collections.abc import Mapping

from unirank.distenv import DistEnv
from unirank.envvars import check_rank, read_int
from unirank.errors import ConfigError
from unirank.launchers._base import Context, Launcher, Layout, MasterHint, by_slot, finish

NAME = "horovodrun"
KEYS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
#: what horovodrun always sets besides KEYS; read when present
CROSS_RANK, CROSS_SIZE = "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"
HOSTNAME = "HOROVOD_HOSTNAME"
#: the gloo rendezvous server horovodrun runs (the runtime's horovod backend reads them too)
RENDEZVOUS_ADDR, RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"


def _layout(environ: Mapping[str, str]) -> Layout:
    """Ranks from HOROVOD_*; nodes from the cross communicator, else by slot.

    Reads: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
    HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE.
    """
    rank = read_int(environ, "HOROVOD_RANK")
    world = read_int(environ, "HOROVOD_SIZE", minimum=1)
    check_rank(rank, world, rank_var="HOROVOD_RANK", size_var="HOROVOD_SIZE")
    local_rank = read_int(environ, "HOROVOD_LOCAL_RANK")
    local_world = read_int(environ, "HOROVOD_LOCAL_SIZE", minimum=1)
    check_rank(local_rank, local_world, rank_var="HOROVOD_LOCAL_RANK",
               size_var="HOROVOD_LOCAL_SIZE")
    sources = {"rank": "HOROVOD_RANK", "world_size": "HOROVOD_SIZE",
               "local_rank": "HOROVOD_LOCAL_RANK", "local_world_size": "HOROVOD_LOCAL_SIZE"}
    if CROSS_RANK in environ and CROSS_SIZE in environ:
        node_rank = read_int(environ, CROSS_RANK)
        num_nodes = read_int(environ, CROSS_SIZE, minimum=1)
        check_rank(node_rank, num_nodes, rank_var=CROSS_RANK, size_var=CROSS_SIZE)
        sources.update(node_rank=CROSS_RANK, num_nodes=CROSS_SIZE)
    else:
        node_rank, num_nodes = by_slot(rank, world, local_world)
        sources.update(node_rank="derived: HOROVOD_RANK // HOROVOD_LOCAL_SIZE",
                       num_nodes="derived: HOROVOD_SIZE / HOROVOD_LOCAL_SIZE")
    return Layout(rank, local_rank, world, local_world, node_rank, num_nodes, sources)


def detect(environ: Mapping[str, str], ctx: Context) -> DistEnv | None:
    """A horovodrun worker, or None.

    Reads: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
    HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME, HOROVOD_GLOO_RENDEZVOUS_ADDR,
    HOROVOD_GLOO_RENDEZVOUS_PORT, SLURMD_NODENAME, UNIRANK_NODE_NAME, MASTER_ADDR, MASTER_PORT.
    """
    if "HOROVOD_RANK" not in environ and "HOROVOD_SIZE" not in environ:
        return None
    missing = [key for key in KEYS if key not in environ]
    if missing:
        raise ConfigError(
            f"is set but {', '.join(missing)} is not",
            variable="HOROVOD_RANK" if "HOROVOD_RANK" in environ else "HOROVOD_SIZE",
            value=environ.get("HOROVOD_RANK", environ.get("HOROVOD_SIZE")),
            hint="start the workers with horovodrun (or unset the HOROVOD_* variables left over "
            "from another job)",
        )
    rendezvous_host = environ.get(RENDEZVOUS_ADDR, "").strip()
    rendezvous_port = environ.get(RENDEZVOUS_PORT, "").strip() or None
    master = MasterHint(hosts=(rendezvous_host,) if rendezvous_host else (),
                        hosts_source=RENDEZVOUS_ADDR, job_id=rendezvous_port,
                        job_source=RENDEZVOUS_PORT)
    return finish(NAME, environ, ctx, _layout(environ), master=master,
                  own_node=(environ.get(HOSTNAME, ""), HOSTNAME))


LAUNCHER = Launcher(NAME, detect, keys=KEYS)
