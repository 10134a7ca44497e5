"""The local worker supervisor behind ``unirank run``.

The parent process (``unirank run``) never imports torch: it plans the workers' environments
(:mod:`.plan`), opens the rendezvous port on node 0 (:mod:`.listen`), starts and watches the
workers (:mod:`.procs`) and reports how they ended (:mod:`.summary`). Each worker starts in
:mod:`.bootstrap`, which arms the parent-death signal (:mod:`.pdeathsig`), hosts or joins the
rendezvous store, waits for every rank to join (:mod:`unirank.joincheck`) and then runs the user's
script exactly as ``python script.py`` would.

This package's ``__init__`` imports nothing, so that a worker's bootstrap starts quickly.
"""
