"""The keys unirank sets in a job's store, one module per protocol, one naming style:
``unirank/<protocol>/<name>[/<part>...]`` (slashes; numbers as parts):

* :mod:`.join`: every rank announces itself, and the watchdog names the ranks that never came
  (:mod:`unirank.joincheck`);
* :mod:`.init`: ``ur.init``'s key prefix per init (:mod:`unirank.runtime.lifecycle`), each group
  start's join keys (:mod:`unirank.supervisor.worker.groupstart`), the ranks' claims and the
  exit barrier of ``unirank run``'s workers (:mod:`unirank.supervisor.worker.store`), Horovod's
  host exchange (:mod:`unirank.runtime.backends.horovod`);
* :mod:`.hang`: the hang detector's exchange (:mod:`unirank.hang.watcher`);
* :mod:`.timeline`: the end-of-run records (:mod:`unirank.supervisor.worker.timeline`).

The dynamic rendezvous uses no store: its helpers speak their own line protocol
(:mod:`unirank.supervisor.rdzv.wire`).

Pure constants and functions; imports nothing. tests/test_storekeys.py checks that no other
module spells a key out.
"""
