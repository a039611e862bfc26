"""The simulator: the production ``Node`` on an in-memory network with a fake clock.

``net`` is the network (loss, duplication, latency, cuts that drop, close or reset, power
loss), ``sim`` runs many nodes on it, ``agents`` is torch's elastic agent reduced to what the
rendezvous sees, and ``transcript`` runs the text files of ``tests/transcripts``. The unit
tests, the fault swarm (``tests/swarm``) and the benchmarks build on it, as ``trio.testing``
and etcd's ``rafttest`` do; nothing in the package imports it, and it imports no socket.
"""
