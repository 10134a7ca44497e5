"""The local worker supervisor behind ``unirank run``.

The parent process (``unirank run``) never imports torch: it plans the workers (:mod:`.plan`)
and their environments (:mod:`.workerenv`), opens the rendezvous port on node 0
(:mod:`.listen`), starts and watches the workers (:mod:`.procs`) and reports how they ended
(:mod:`.summary`). Each worker is forked from the node's fork server, which imported torch once
(:mod:`.forkclient`, :mod:`.forkserver`, :mod:`.forked`), or, where it cannot be, starts in
:mod:`.bootstrap`; either arms the parent-death signal (:mod:`.pdeathsig`) and hands over to
:mod:`.worker`: it hosts or joins the rendezvous store and
waits for every rank to join (:mod:`.workerstore`, :mod:`unirank.joincheck`), then runs the
user's script exactly as ``python script.py`` would (:mod:`.target`).

This package's ``__init__`` imports nothing, so that a worker's bootstrap starts quickly.
"""
