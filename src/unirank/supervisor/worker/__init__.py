"""Code run by each worker process: bootstrap.py (a worker started as its own interpreter),
main.py (the worker's sequence), info.py (its settings), store.py (its side of the store),
groupstart.py, lateenv.py, cmdline.py, target.py (running the user's program), timeline.py,
pdeathsig.py."""
