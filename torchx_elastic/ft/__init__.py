"""torchft replica groups under torchx: the Lighthouse role and the replica groups' launcher.

``ft.ddp`` (``torchx_elastic.components.ft``) builds an app of one ``lighthouse`` role and
R ``group<g>`` roles. The Lighthouse role runs :mod:`torchx_elastic.ft.lighthouse` (torchft's
Lighthouse plus a small registry of the groups' ends); each group's replicas run
:mod:`torchx_elastic.ft.group`, which gives the bundled agent torchft's variables, runs it and
tells the Lighthouse role when that agent has ended, so the app ends when the training ends.

The group launcher imports the standard library only (it is on every node's start path);
the Lighthouse imports torchft.
"""
