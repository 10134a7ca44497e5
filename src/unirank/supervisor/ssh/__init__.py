"""``unirank run --hosts``: one ``unirank run`` per host over OpenSSH's client (docs/ssh.md)."""
