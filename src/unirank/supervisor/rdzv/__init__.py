"""The dynamic rendezvous of ``unirank run --rdzv-backend c10d`` without ``--node-rank``:
torch's own ``DynamicRendezvousHandler`` (``torch.distributed.elastic.rendezvous``) over a c10d
store, run by a small helper process so that the ``unirank run`` parent never
imports torch.

* :mod:`.spec` (pure): what a node asks (:class:`~.spec.RdzvSpec`), what it tells the others
  (:class:`~.spec.NodeRecord`) and what it gets (:class:`~.spec.Assignment`): the node ranks in
  their one order (:func:`~.spec.assign`);
* :mod:`.client` (the parent): starts the helper, reads its answer with a deadline, ends it;
* :mod:`.agent` (the helper, ``python -m unirank.supervisor.rdzv.agent``; imports torch): serves
  or joins the store at the endpoint, refuses a node started twice or from another job, runs
  ``next_rendezvous()`` and keeps the node alive in the rendezvous until the parent ends.
"""
