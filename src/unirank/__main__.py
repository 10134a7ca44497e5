"""``python -m unirank``: the same as the ``unirank`` command."""

from unirank.cli.main import entry

entry()
