"""The dynamic rendezvous of ``unirank run --rdzv-backend c10d`` without ``--node-rank``:
unirank's own (torchrun's options and meaning), run by a small helper process per node so that
the ``unirank run`` parent never imports torch (the helper does not either).

* :mod:`.spec` (pure): what a node asks (:class:`~.spec.RdzvSpec`), what it tells the others
  (:class:`~.spec.NodeRecord`) and what it gets (:class:`~.spec.Assignment`): the node ranks in
  their one order (:func:`~.spec.assign`);
* :mod:`.conf` (pure): ``--rdzv-conf``'s one parser and its defaults;
* :mod:`.rounds` (pure): when a round closes (under a quorum of the last round's nodes: one
  world at every moment), who is in it, and the successor of a lost server;
* :mod:`.wire`: JSON lines over TCP; :mod:`.server`: the rendezvous's server (a thread of the
  serving node's helper);
* :mod:`.client` (the parent): starts the helper, reads its answer with a deadline, ends it;
* :mod:`.reach`: the helper's refusal, identity, endpoint socket and connect;
* :mod:`.agent` (the helper, ``python -m unirank.supervisor.rdzv.agent``): serves or joins the
  rendezvous at the endpoint, beats, passes news on, takes the rendezvous over where its
  server is lost, until the parent ends.
"""
