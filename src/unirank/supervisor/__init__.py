"""The local worker supervisor behind ``unirank run`` and ``Parallel``.

Folders show which process runs the code:

- this folder: the parent (``unirank run``), which never imports torch. It plans the workers
  (:mod:`.plan`) and their environments (:mod:`.workerenv`), opens the rendezvous port on
  node 0 (:mod:`.listen`), starts and watches the workers (:mod:`.engine`, :mod:`.attempts`,
  :mod:`.streams`) and reports how they ended (:mod:`.summary`). Its short helper children
  (:mod:`.helper`) are other processes: the stop-report child (:mod:`.stopreport` ->
  :mod:`unirank.hang.onstop`) and the give-up child (:mod:`.giveup`) import torch when they
  open the job's store (on Ctrl-C's path, and when a node refuses to start);
- :mod:`.rdzv` (the dynamic rendezvous's helper) and :mod:`.ssh` (``--hosts``): no torch;
- :mod:`.fork`: the fork server that imported torch once and must never run a thread, its
  client in the parent and the forked child becoming its worker;
- :mod:`.worker`: each worker, forked or started as its own interpreter
  (:mod:`.worker.bootstrap`): it hosts or joins the rendezvous store, waits for every rank,
  then runs the user's program exactly as ``python script.py`` would.

This package's ``__init__`` imports nothing, so that a worker's bootstrap starts quickly.
"""
