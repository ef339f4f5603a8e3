"""TorchX components of torchx-elastic (``dist.ddp``, ``dist.spmd``, ``ft.ddp``).

torchx's component finder lists every module-level function under this package as a
component, so only component functions live at module level in ``dist.py``; helpers
are classes.
"""
