"""``unirank doctor``: pre-flight checks that turn a silent hang at init into one line with a fix.

:mod:`~unirank.doctor.result` (the row and the table), :mod:`~unirank.doctor.netinfo` (ports,
probes, name look-ups: the system calls; interfaces and routes come from
:mod:`unirank.netroute`), :mod:`~unirank.doctor.facts` (gathers one rank's facts),
:mod:`~unirank.doctor.checks` (pure checks over one rank's facts),
:mod:`~unirank.doctor.groupchecks` (pure checks over every rank's report),
:mod:`~unirank.doctor.group` (the gloo group that gathers the reports). No torch at import.
"""
