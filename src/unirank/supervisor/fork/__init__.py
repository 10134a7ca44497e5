"""The fork server: client.py runs in the ``unirank run`` parent (no torch), server.py is the
server process (imports torch once, never runs a thread), child.py is a forked child becoming
its worker; protocol.py is what both sides exchange; importtime.py the values a fresh
interpreter fixes at import; dispositions.py the signal dispositions a forked worker starts
with (those of a child its supervisor exec'ed)."""
