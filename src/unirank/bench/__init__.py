"""``unirank bench``: collective bandwidth in nccl-tests' format.

Pure parts (no torch): :mod:`sizes` (``4K``/``256M`` parsing, the size sweep), :mod:`ops` (the
five collectives: buffer layouts and bus-bandwidth factors as nccl-tests counts them, the dtypes),
:mod:`config` (the validated options), :mod:`report` (the table, CSV and JSON), :mod:`progress`
(the stderr bar). :mod:`loop` times and checks one collective at one size (torch);
:mod:`worker` is the body every rank runs; :mod:`plot` draws the PNG (matplotlib).
"""
