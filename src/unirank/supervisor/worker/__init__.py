"""Code run by each worker process: bootstrap.py (a worker started as its own interpreter),
main.py (the worker's sequence), info.py (its settings), numabind.py (``--numa-binding``),
faults.py (the faulthandler), cmdline.py, store.py (its side of the store), groupstart.py,
lateenv.py, target.py (running the user's program), timeline.py, pdeathsig.py."""
