"""``python -m unirank.jobenv``: kept for batch scripts written by earlier versions; see
:mod:`unirank.sbatch.jobenv`."""
from unirank.sbatch.jobenv import main

if __name__ == "__main__":
    raise SystemExit(main())
