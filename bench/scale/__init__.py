"""The rendezvous at scale: ``python -m bench.scale --nodes 16,64,256 --impl torch,ours``.

See docs/bench.md, "Rendezvous at scale".
"""
